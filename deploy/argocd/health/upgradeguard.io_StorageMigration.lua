-- Argo CD health of an upgradeguard StorageMigration (upgradeguard.io).
-- Shipped by upgradeguard in deploy/argocd; the argocd-cm key is
-- resource.customizations.health.upgradeguard.io_StorageMigration.
-- Progressing while the controller migrates (a sync wave waits), Healthy once every
-- CRD is migrated and its storedVersions pruned, Degraded when it failed or was
-- refused and needs an operator (the sync stops with this message).
-- Uses no Lua standard library, as argocd-cm scripts run without them.
local hs = {}
local st = obj.status

local function crds()
  if obj.spec == nil or obj.spec.resources == nil then
    return "its CRDs"
  end
  return table.concat(obj.spec.resources, ", ")
end

local function condition(t)
  if st == nil or st.conditions == nil then
    return nil
  end
  for _, c in ipairs(st.conditions) do
    if c.type == t then
      return c
    end
  end
  return nil
end

local function count(n)
  if n == nil then
    return "0"
  end
  return tostring(n)
end

local function versions(list)
  if list == nil then
    return "[]"
  end
  return "[" .. table.concat(list, " ") .. "]"
end

if st == nil or st.phase == nil or st.phase == "" then
  hs.status = "Progressing"
  hs.message = "waiting for the upgradeguard controller to start migrating " .. crds()
  return hs
end

if st.observedGeneration ~= obj.metadata.generation then
  hs.status = "Progressing"
  hs.message = "the spec changed: waiting for the upgradeguard controller to start migrating " .. crds() .. " over"
  return hs
end

local resources = st.resources or {}

if st.phase == "Succeeded" then
  local parts = {}
  for _, r in ipairs(resources) do
    table.insert(parts, r.name .. ": " .. count(r.objects) .. " objects, " .. count(r.rewritten) ..
      " rewritten, storedVersions " .. versions(r.storedVersionsAfter))
  end
  hs.status = "Healthy"
  hs.message = "migrated " .. table.concat(parts, "; ")
  return hs
end

if st.phase == "Failed" then
  local failed = condition("Failed")
  local msg = ""
  if failed ~= nil and failed.message ~= nil and failed.message ~= "" then
    msg = failed.message
  else
    for _, r in ipairs(resources) do
      if r.phase == "Failed" then
        msg = r.name .. ": " .. (r.message or "failed")
      end
    end
  end
  local reason = "MigrationFailed"
  if failed ~= nil and failed.reason ~= nil then
    reason = failed.reason
  end
  hs.status = "Degraded"
  hs.message = "migration failed (" .. reason .. "): " .. msg
  return hs
end

-- Running (or Pending): say where each CRD is.
local done, total, parts, waiting = 0, 0, {}, {}
for _, r in ipairs(resources) do
  total = total + 1
  if r.phase == "Succeeded" then
    done = done + 1
  elseif r.phase == "Running" then
    local p = "migrating " .. r.name .. ": " .. count(r.objects) .. " objects so far, " .. count(r.rewritten) .. " rewritten"
    if r.message ~= nil and r.message ~= "" then
      p = p .. " (" .. r.message .. ")"
    end
    table.insert(parts, p)
  else
    table.insert(waiting, r.name)
  end
end
if #waiting > 0 then
  table.insert(parts, "waiting: " .. table.concat(waiting, ", "))
end
if #parts == 0 and total > 0 and done == total then
  table.insert(parts, "migrated " .. crds() .. "; the controller is recording the result")
elseif #parts == 0 then
  table.insert(parts, "migrating " .. crds())
end
hs.status = "Progressing"
hs.message = table.concat(parts, "; ") .. " (" .. tostring(done) .. "/" .. tostring(total) .. " CRDs done)"
return hs
