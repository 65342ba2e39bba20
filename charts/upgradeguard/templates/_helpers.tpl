{{/* Chart name. */}}
{{- define "upgradeguard.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name of the objects: release name plus chart name, unless one contains the other. */}}
{{- define "upgradeguard.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "upgradeguard.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "upgradeguard.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Selector labels of the controller Pods. */}}
{{- define "upgradeguard.selectorLabels" -}}
app.kubernetes.io/name: {{ include "upgradeguard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end }}

{{/* ServiceAccount name. */}}
{{- define "upgradeguard.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "upgradeguard.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Secret holding the webhook's serving certificate (tls.crt, tls.key, ca.crt). */}}
{{- define "upgradeguard.webhookSecretName" -}}
{{- printf "%s-webhook-tls" (include "upgradeguard.fullname" .) }}
{{- end }}

{{/* cert-manager Certificate of the webhook. */}}
{{- define "upgradeguard.certificateName" -}}
{{- printf "%s-webhook" (include "upgradeguard.fullname" .) }}
{{- end }}

{{/* DNS names the webhook Service answers to. */}}
{{- define "upgradeguard.webhookDNSNames" -}}
{{- $svc := include "upgradeguard.fullname" . }}
{{- $ns := .Release.Namespace }}
{{- list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) | toJson }}
{{- end }}

{{/* Controller image reference: the digest wins over the tag. */}}
{{- define "upgradeguard.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* Directory the webhook certificate is mounted at (--webhook-cert-dir). */}}
{{- define "upgradeguard.certDir" -}}
/etc/upgradeguard/webhook-certs
{{- end }}
