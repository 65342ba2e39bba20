-- Argo CD health of a CustomResourceDefinition: Argo CD's own CRD rules (terminating,
-- names, established, structural schema), plus the StorageMigrating condition that
-- kube-controller-manager's storage version migrator sets on the CRD while it
-- re-persists the CRD's objects and clears when it has pruned status.storedVersions.
-- Shipped by upgradeguard in deploy/argocd; the argocd-cm key is
-- resource.customizations.health.apiextensions.k8s.io_CustomResourceDefinition, and it
-- replaces Argo CD's built-in CRD check.
-- Uses no Lua standard library, as argocd-cm scripts run without them.
local hs = {}

if obj.metadata.deletionTimestamp ~= nil then
  hs.status = "Progressing"
  hs.message = "CRD is terminating"
  return hs
end

local conditions = {}
if obj.status ~= nil and obj.status.conditions ~= nil then
  conditions = obj.status.conditions
end
if #conditions == 0 then
  hs.status = "Progressing"
  hs.message = "no status conditions yet: the API server has not processed the CRD"
  return hs
end

local byType = {}
for _, c in ipairs(conditions) do
  byType[c.type] = c
end

local function said(c)
  if c == nil or c.message == nil or c.message == "" then
    return ""
  end
  return ": " .. c.message
end

local terminating = byType["Terminating"]
if terminating ~= nil and terminating.status == "True" then
  hs.status = "Progressing"
  hs.message = "CRD is terminating" .. said(terminating)
  return hs
end

local names = byType["NamesAccepted"]
if names ~= nil and names.status == "False" then
  hs.status = "Degraded"
  hs.message = "CRD names have not been accepted" .. said(names)
  return hs
end

local established = byType["Established"]
if established == nil or (established.status ~= "True" and established.reason == "Installing") then
  hs.status = "Progressing"
  hs.message = "CRD is being established" .. said(established)
  return hs
end
if established.status ~= "True" then
  hs.status = "Degraded"
  hs.message = "CRD is not established" .. said(established)
  return hs
end

local nonStructural = byType["NonStructuralSchema"]
if nonStructural ~= nil and nonStructural.status == "True" then
  hs.status = "Degraded"
  hs.message = "Schema violations found" .. said(nonStructural)
  return hs
end

-- Storage: the storage version, and the stored versions other than it.
local storage
if obj.spec ~= nil and obj.spec.versions ~= nil then
  for _, v in ipairs(obj.spec.versions) do
    if v.storage == true then
      storage = v.name
    end
  end
end
local stored, older = {}, {}
if obj.status.storedVersions ~= nil then
  stored = obj.status.storedVersions
end
for _, v in ipairs(stored) do
  if v ~= storage then
    table.insert(older, v)
  end
end
local storedText = "status.storedVersions [" .. table.concat(stored, " ") .. "]"

-- The migrator's reason decides before the status: kube-controller-manager 1.37 ends a
-- failed migration with False and reason MigrationFailed, the v1beta1 migrator with True.
local migrating = byType["StorageMigrating"]
if migrating ~= nil and migrating.reason == "MigrationFailed" then
  hs.status = "Degraded"
  hs.message = "the last storage migration failed" .. said(migrating) .. "; " .. storedText ..
    ": objects may still be stored at older versions; fix the cause and migrate again (a new StorageVersionMigration," ..
    " or upgradeguard migrate --crd " .. obj.metadata.name .. " --engine builtin), which also clears this condition"
  return hs
end
if migrating ~= nil and migrating.status == "True" then
  hs.status = "Progressing"
  hs.message = "storage migration running" .. said(migrating) .. "; objects are being re-persisted at " ..
    tostring(storage) .. ", " .. storedText ..
    " (the StorageVersionMigration it names clears this when it ends; if it was deleted first, a new one does)"
  return hs
end

hs.status = "Healthy"
hs.message = "CRD is healthy"
if migrating ~= nil and migrating.status == "False" and migrating.reason == "MigrationSucceeded" then
  hs.message = hs.message .. "; the last storage migration succeeded"
end
if #older > 0 then
  hs.message = hs.message .. "; objects may still be stored at " .. table.concat(older, ", ") .. " (" .. storedText ..
    ", storage version " .. tostring(storage) .. "): migrate them before a release removes " .. table.concat(older, ", ")
else
  hs.message = hs.message .. "; " .. storedText
end
return hs
