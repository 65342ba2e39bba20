#!/usr/bin/env bash
# upgradeguard-review.sh github|gitlab runs `upgradeguard review` on a pull request (GitHub)
# or a merge request (GitLab), keeps one comment on it with the verdict, writes the file the
# platform's code-scanning or test report reads, and exits with review's exit code: 0 safe,
# 1 findings, 2 could not run (a failed comment request is "could not run" too). It is the
# logic of deploy/github-action/action.yml and deploy/gitlab/upgradeguard-review.gitlab-ci.yml,
# and reads only the environment either platform sets, so it runs the same anywhere.
#
# The comment is found by the hidden marker its body starts with (review's -o markdown
# writes it) and updated in place; only the first run of a pull request creates one.
#
# Inputs (environment):
#   UPGRADEGUARD           the upgradeguard command (default: upgradeguard on PATH)
#   UPGRADEGUARD_CLUSTERS  PATH=CONTEXT mappings, one per line or space-separated
#                          (each becomes --cluster PATH=CONTEXT)
#   UPGRADEGUARD_ARGS      further review arguments, split on whitespace
#   UPGRADEGUARD_COMMENT   "false" to leave the comment out (a fork's read-only token)
#   KUBECONFIG             the kubeconfig whose contexts the mappings name
# GitHub:
#   GITHUB_API_URL, GITHUB_REPOSITORY, GITHUB_EVENT_PATH (a pull_request event), GITHUB_TOKEN
#   UPGRADEGUARD_SARIF     where to write SARIF for upload-sarif (default upgradeguard.sarif;
#                          empty: none)
#   GITHUB_OUTPUT          if set, receives exit-code=N and sarif-file=PATH
# GitLab:
#   CI_API_V4_URL, CI_PROJECT_ID, CI_MERGE_REQUEST_IID, CI_MERGE_REQUEST_DIFF_BASE_SHA,
#   CI_MERGE_REQUEST_SOURCE_BRANCH_SHA (merged results pipelines) or CI_COMMIT_SHA
#   UPGRADEGUARD_GITLAB_TOKEN  a project or group access token with the api scope
#                              (CI_JOB_TOKEN cannot write notes)
#   UPGRADEGUARD_JUNIT     where to write JUnit for artifacts:reports:junit (default
#                          upgradeguard-junit.xml; empty: none)
#
# The token is sent in a curl config read from a pipe, never on a command line, and never
# printed.
set -uo pipefail
set -f # the mappings and extra arguments are split on whitespace, never globbed

readonly marker='<!-- upgradeguard:review -->'
mode=${1:-}
ug=${UPGRADEGUARD:-upgradeguard}

die() {
  echo "upgradeguard-review: $*" >&2
  exit 2
}

for tool in curl jq; do
  command -v "$tool" >/dev/null || die "$tool is missing: install it (apt-get install $tool)"
done

tmp=$(mktemp -d) || die "cannot create a temporary directory"
trap 'rm -rf "$tmp"' EXIT

case $mode in
github)
  : "${GITHUB_API_URL:?GITHUB_API_URL is unset: run this on GitHub Actions or set it}"
  : "${GITHUB_REPOSITORY:?GITHUB_REPOSITORY (owner/name) is unset}"
  : "${GITHUB_EVENT_PATH:?GITHUB_EVENT_PATH is unset: run this on a pull_request event}"
  number=$(jq -er '.pull_request.number' "$GITHUB_EVENT_PATH") ||
    die "$GITHUB_EVENT_PATH holds no pull request: run the action on pull_request or pull_request_target"
  base=$(jq -er '.pull_request.base.sha' "$GITHUB_EVENT_PATH") || die "$GITHUB_EVENT_PATH: no pull_request.base.sha"
  head=$(jq -er '.pull_request.head.sha' "$GITHUB_EVENT_PATH") || die "$GITHUB_EVENT_PATH: no pull_request.head.sha"
  report=${UPGRADEGUARD_SARIF-upgradeguard.sarif}
  report_format=sarif
  ;;
gitlab)
  : "${CI_API_V4_URL:?CI_API_V4_URL is unset: run this in a GitLab CI job or set it}"
  : "${CI_PROJECT_ID:?CI_PROJECT_ID is unset}"
  : "${CI_MERGE_REQUEST_IID:?CI_MERGE_REQUEST_IID is unset: run the job in a merge request pipeline (rules: if: \$CI_PIPELINE_SOURCE == \"merge_request_event\")}"
  : "${CI_MERGE_REQUEST_DIFF_BASE_SHA:?CI_MERGE_REQUEST_DIFF_BASE_SHA is unset: run the job in a merge request pipeline}"
  number=$CI_MERGE_REQUEST_IID
  base=$CI_MERGE_REQUEST_DIFF_BASE_SHA
  head=${CI_MERGE_REQUEST_SOURCE_BRANCH_SHA:-${CI_COMMIT_SHA:?CI_COMMIT_SHA is unset}}
  report=${UPGRADEGUARD_JUNIT-upgradeguard-junit.xml}
  report_format=junit
  ;;
*) die "usage: upgradeguard-review.sh github|gitlab" ;;
esac

comment=true
[[ ${UPGRADEGUARD_COMMENT:-true} == false ]] && comment=false
if [[ $comment == true ]]; then
  if [[ $mode == github ]]; then
    [[ -n ${GITHUB_TOKEN:-} ]] || die "GITHUB_TOKEN is unset: pass the token (with pull-requests: write), or set comment: false"
  else
    [[ -n ${UPGRADEGUARD_GITLAB_TOKEN:-} ]] || die "UPGRADEGUARD_GITLAB_TOKEN is unset: add a project access token with the api scope as a masked CI/CD variable, or set UPGRADEGUARD_COMMENT=false"
  fi
fi

args=(review --base "$base" --head "$head")
for c in ${UPGRADEGUARD_CLUSTERS:-}; do
  args+=(--cluster "$c")
done
# shellcheck disable=SC2206 # extra arguments are split on whitespace, as documented
extra=(${UPGRADEGUARD_ARGS:-})
args+=("${extra[@]}")

echo "upgradeguard-review: reviewing $base..$head"
"$ug" "${args[@]}" -o markdown >"$tmp/body.md"
code=$?
case $code in
0 | 1 | 2) ;;
*) code=2 ;;
esac
if [[ -n $report ]]; then
  # A second run writes the report file; its exit code is the first one's unless it could
  # not run.
  "$ug" "${args[@]}" -o "$report_format" >"$report" || {
    rc=$?
    ((rc != 1)) && echo "upgradeguard-review: review -o $report_format exited $rc; $report may be incomplete" >&2
  }
fi
if [[ $code == 2 ]] || [[ $(head -c ${#marker} "$tmp/body.md") != "$marker" ]]; then
  code=2
  printf '%s\n**upgradeguard review** could not run on %s..%s (exit 2): the job log says why.\n' "$marker" "${base:0:12}" "${head:0:12}" >"$tmp/body.md"
fi
cat "$tmp/body.md"

# api METHOD URL [JSON-FILE]: one request with the token; the body goes to $tmp/resp, the
# headers to $tmp/hdr; prints the HTTP status.
api() {
  local method=$1 url=$2 data=${3:-} auth
  if [[ $mode == github ]]; then
    auth=$(printf 'header = "Authorization: Bearer %s"\nheader = "Accept: application/vnd.github+json"\nheader = "X-GitHub-Api-Version: 2022-11-28"' "$GITHUB_TOKEN")
  else
    auth=$(printf 'header = "PRIVATE-TOKEN: %s"' "$UPGRADEGUARD_GITLAB_TOKEN")
  fi
  local opts=(-sS -X "$method" -D "$tmp/hdr" -o "$tmp/resp" -w '%{http_code}' --config -)
  [[ -n $data ]] && opts+=(-H 'Content-Type: application/json' --data-binary "@$data")
  curl "${opts[@]}" "$url" <<<"$auth"
}

# existing prints the id of the comment that starts with the marker, reading every page.
existing() {
  local url status next page=1
  if [[ $mode == github ]]; then
    url="$GITHUB_API_URL/repos/$GITHUB_REPOSITORY/issues/$number/comments?per_page=100"
  else
    url="$CI_API_V4_URL/projects/$CI_PROJECT_ID/merge_requests/$number/notes?per_page=100&sort=asc&page=1"
  fi
  while [[ -n $url ]]; do
    status=$(api GET "$url") || return 2
    [[ $status == 200 ]] || {
      echo "upgradeguard-review: listing the comments: HTTP $status: $(head -c 300 "$tmp/resp")" >&2
      return 2
    }
    jq -r --arg m "$marker" 'first(.[] | select((.body // "") | startswith($m)) | .id) // empty' "$tmp/resp" | grep . && return 0
    next=
    if [[ $mode == github ]]; then
      next=$(tr -d '\r' <"$tmp/hdr" | sed -n 's/^[Ll]ink:.*<\([^>]*\)>; *rel="next".*/\1/p')
      # The token goes only to the API it was given for.
      [[ $next == "$GITHUB_API_URL"/* ]] || next=
    else
      page=$(tr -d '\r' <"$tmp/hdr" | sed -n 's/^[Xx]-[Nn]ext-[Pp]age: *\([0-9]*\).*/\1/p')
      [[ -n $page ]] && next="$CI_API_V4_URL/projects/$CI_PROJECT_ID/merge_requests/$number/notes?per_page=100&sort=asc&page=$page"
    fi
    url=$next
  done
  return 0
}

post() {
  local id status url method
  id=$(existing) || return 2
  jq -n --rawfile body "$tmp/body.md" '{body: $body}' >"$tmp/req.json"
  if [[ $mode == github ]]; then
    if [[ -n $id ]]; then
      method=PATCH url="$GITHUB_API_URL/repos/$GITHUB_REPOSITORY/issues/comments/$id"
    else
      method=POST url="$GITHUB_API_URL/repos/$GITHUB_REPOSITORY/issues/$number/comments"
    fi
  else
    if [[ -n $id ]]; then
      method=PUT url="$CI_API_V4_URL/projects/$CI_PROJECT_ID/merge_requests/$number/notes/$id"
    else
      method=POST url="$CI_API_V4_URL/projects/$CI_PROJECT_ID/merge_requests/$number/notes"
    fi
  fi
  status=$(api "$method" "$url" "$tmp/req.json") || return 2
  if [[ $status != 200 && $status != 201 ]]; then
    echo "upgradeguard-review: $method $url: HTTP $status: $(head -c 300 "$tmp/resp")" >&2
    return 2
  fi
  echo "upgradeguard-review: $([[ -n $id ]] && echo "updated comment $id" || echo "created comment $(jq -r .id "$tmp/resp")") on $number"
}

if [[ $comment == true ]]; then
  post || {
    echo "upgradeguard-review: could not write the comment (review exited $code); check the token's permissions" >&2
    code=2
  }
fi
if [[ -n ${GITHUB_OUTPUT:-} ]]; then
  printf 'exit-code=%s\nsarif-file=%s\n' "$code" "$report" >>"$GITHUB_OUTPUT"
fi
exit "$code"
