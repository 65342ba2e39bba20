-- Argo CD health of a Kubernetes StorageVersionMigration (storagemigration.k8s.io v1
-- and v1beta1, run by kube-controller-manager's storage-version-migrator-controller).
-- Shipped by upgradeguard in deploy/argocd; the argocd-cm key is
-- resource.customizations.health.storagemigration.k8s.io_StorageVersionMigration.
-- Without it Argo CD gives the object no health and a sync wave does not wait for it.
-- Progressing until the migration has succeeded and the migrator has recorded it on the
-- CRD (the moment status.storedVersions is pruned), Healthy then, Degraded when it failed.
-- Uses no Lua standard library, as argocd-cm scripts run without them.
local hs = {}

local target = "the resource"
if obj.spec ~= nil and obj.spec.resource ~= nil and obj.spec.resource.resource ~= nil then
  target = obj.spec.resource.resource
  if obj.spec.resource.group ~= nil and obj.spec.resource.group ~= "" then
    target = target .. "." .. obj.spec.resource.group
  end
end

local running, succeeded, failed
if obj.status ~= nil and obj.status.conditions ~= nil then
  for _, c in ipairs(obj.status.conditions) do
    if c.status == "True" then
      if c.type == "Running" then
        running = c
      elseif c.type == "Succeeded" then
        succeeded = c
      elseif c.type == "Failed" then
        failed = c
      end
    end
  end
end

local function said(c)
  if c == nil or c.message == nil or c.message == "" then
    return ""
  end
  return ": " .. c.message
end

if failed ~= nil then
  hs.status = "Degraded"
  hs.message = "migrating " .. target .. " failed" .. said(failed) ..
    "; objects may still be stored at older versions whatever the CRD's status.storedVersions says: fix the cause" ..
    " and migrate again (a StorageVersionMigration runs once: create one with a new name, or run upgradeguard migrate --crd " ..
    target .. ")"
  return hs
end

if succeeded ~= nil and running ~= nil then
  hs.status = "Progressing"
  hs.message = "migrated " .. target .. said(running) ..
    "; waiting for kube-controller-manager to record it on the CRD and prune status.storedVersions"
  return hs
end

if succeeded ~= nil then
  hs.status = "Healthy"
  hs.message = "migrated " .. target .. said(succeeded)
  return hs
end

if running ~= nil then
  hs.status = "Progressing"
  hs.message = "migrating " .. target .. said(running)
  return hs
end

hs.status = "Progressing"
hs.message = "waiting for kube-controller-manager's storage version migrator to start migrating " .. target ..
  " (it runs one migration per resource at a time, and only where its storage-version-migrator-controller is enabled)"
return hs
