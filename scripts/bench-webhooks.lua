-- wrk script for scripts/bench-webhooks.sh: signed-off (X-Gitlab-Token) GitLab MR webhooks,
-- each with its own Idempotency-Key, MR number and head commit, so every request is a new
-- delivery that is committed to SQLite and enqueues (and supersedes) real plan jobs.
local template = nil
local counter = 0
local thread_id = 0
local threads = {}

function setup(thread)
  thread:set("thread_id", #threads)
  table.insert(threads, thread)
end

function init(args)
  local f = assert(io.open(os.getenv("BENCH_BODY"), "r"))
  template = f:read("*a")
  f:close()
  math.randomseed(os.time() + thread_id * 7919)
end

local function hex40()
  local t = {}
  for i = 1, 5 do t[i] = string.format("%08x", math.random(0, 0x7fffffff)) end
  return table.concat(t)
end

function request()
  counter = counter + 1
  local key = string.format("bench-%d-%d-%d-%d", os.time(), thread_id, counter, math.random(0, 1e9))
  local iid = (counter % 500) + 1
  local body = template:gsub('"iid": 16', '"iid": ' .. iid, 1)
                       :gsub('e59094b8de0f2f91abbe4760a52d9137260252d8', hex40(), 1)
  local headers = {
    ["Content-Type"] = "application/json",
    ["X-Gitlab-Event"] = "Merge Request Hook",
    ["X-Gitlab-Token"] = os.getenv("BENCH_SECRET"),
    ["Idempotency-Key"] = key,
    ["User-Agent"] = "GitLab/18.4.0",
  }
  return wrk.format("POST", "/webhooks/gitlab", headers, body)
end

local non200 = 0
function response(status, headers, body)
  if status ~= 200 then non200 = non200 + 1 end
end

function done(summary, latency, requests)
  io.write(string.format("bench: requests %d, errors(socket) %d/%d/%d/%d, non-2xx %d\n",
    summary.requests, summary.errors.connect, summary.errors.read, summary.errors.write,
    summary.errors.timeout, summary.errors.status))
  io.write(string.format("bench: latency p50 %.2f ms, p90 %.2f ms, p99 %.2f ms, max %.2f ms\n",
    latency:percentile(50) / 1000, latency:percentile(90) / 1000, latency:percentile(99) / 1000,
    latency.max / 1000))
  io.write(string.format("bench: %.0f requests/s over %.1f s\n",
    summary.requests / (summary.duration / 1e6), summary.duration / 1e6))
end
