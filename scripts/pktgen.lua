-- Measurements that scripts/pktgen.sh asks Pktgen-DPDK (23.06, built with Lua) to make; run
-- as `pktgen ... -- -f pktgen.lua`. Parameters come from the environment (PG_*), results go
-- to PG_OUT as lines of `key=value` words, one line per trial, for pktgen.sh to tabulate.
--
-- Rates are counts over time, not Pktgen's per-second samples: a trial clears the port
-- counters, starts the port, stops it after PG_SECS, waits until the counters Pktgen reads
-- once a second stand still, and divides the totals by the time between start and stop.

local out = assert(io.open(assert(os.getenv("PG_OUT"), "PG_OUT unset"), "w"))
local mode = os.getenv("PG_MODE") or "tx"
local secs = tonumber(os.getenv("PG_SECS") or "5")
local rounds = tonumber(os.getenv("PG_ROUNDS") or "3")
-- A shell command that prints port N's xstats as `name value` lines (N is appended).
local xstats_cmd = os.getenv("PG_XSTATS")

local function emit(fmt, ...)
  out:write(string.format(fmt, ...), "\n")
  out:flush()
end

-- Seconds since boot, to 10 ms (Lua's os.time() has whole seconds; forking `date` would
-- cost more than that on a busy machine).
local function now()
  local f = assert(io.open("/proc/uptime"))
  local t = f:read("*n")
  f:close()
  return t
end

local function totals(port)
  -- "port" gives Pktgen's copy of rte_eth_stats_get since the last clear, refreshed every
  -- second by its timer.
  return pktgen.portStats(port, "port")[port]
end

-- Waits until two consecutive refreshes of the counters agree (the port has gone quiet and
-- the timer has read it since), for at most `limit_ms`.
local function settle(ports, limit_ms)
  local function snap()
    local s = ""
    for _, p in ipairs(ports) do
      local t = totals(p)
      s = s .. t.opackets .. "/" .. t.ipackets .. "/" .. t.imissed .. " "
    end
    return s
  end
  local prev, waited = snap(), 0
  while waited < limit_ms do
    pktgen.delay(1100)
    waited = waited + 1100
    local cur = snap()
    if cur == prev then
      return true
    end
    prev = cur
  end
  return false
end

local function xstats(port, tag)
  if not xstats_cmd then
    return
  end
  local p = io.popen(xstats_cmd .. " " .. port)
  local words = {}
  for line in p:lines() do
    local k, v = line:match("^(%S+) (%d+)$")
    if k then
      words[#words + 1] = k .. "=" .. v
    end
  end
  p:close()
  emit("xstats %s port=%d %s", tag, port, table.concat(words, " "))
end

-- Sends on `ports` (unpaced unless `rate` is given, in percent of the link) for `secs`,
-- emits one line per port in `report` and returns those ports' totals and the seconds sent.
local function trial(kind, ports, report, extra, rate)
  for _, p in ipairs(report) do
    pktgen.clear(p)
  end
  for _, p in ipairs(ports) do
    pktgen.set(p, "rate", rate or 100)
    if not rate then
      -- Pktgen paces a port by its link speed (net_null reports 10G, ours 40G); one cycle
      -- between bursts takes the pacing away, so each port sends as fast as it can.
      pktgen.set(p, "cycles", 1)
    end
  end
  local t0 = now()
  for _, p in ipairs(ports) do
    pktgen.start(p)
  end
  -- pktgen.delay sleeps in 10 ms steps that each overrun on a busy machine: watch the clock.
  while now() - t0 < secs do
    pktgen.delay(100)
  end
  for _, p in ipairs(ports) do
    pktgen.stop(p)
  end
  local t1 = now()
  local quiet = settle(report, 10000)
  local got = {}
  for _, p in ipairs(report) do
    local t = totals(p)
    got[p] = t
    emit("%s %s port=%d secs=%.2f opackets=%d ipackets=%d imissed=%d ierrors=%d oerrors=%d "
      .. "rx_nombuf=%d settled=%s",
      kind, extra, p, t1 - t0, t.opackets, t.ipackets, t.imissed, t.ierrors, t.oerrors,
      t.rx_nombuf, tostring(quiet))
  end
  return got, t1 - t0
end

local function main()
  pktgen.screen("off")
  -- Let the links come up before the first rate is set (Pktgen paces by link speed).
  pktgen.delay(1000)
  local sizes = {}
  for s in (os.getenv("PG_SIZES") or "64"):gmatch("%d+") do
    sizes[#sizes + 1] = tonumber(s)
  end
  if mode == "tx" then
    -- Port 0 is ours, port 1 net_null; they take turns, ours first.
    for _, size in ipairs(sizes) do
      pktgen.set("all", "size", size)
      for r = 1, rounds do
        for p in (os.getenv("PG_PORTS") or "0 1"):gmatch("%d+") do
          p = tonumber(p)
          trial("tx", { p }, { p }, string.format("size=%d round=%d", size, r))
        end
      end
    end
    xstats(0, "end")
  elseif mode == "cable" then
    local size = sizes[1]
    pktgen.set("all", "size", size)
    -- The device's counters (hca_* causes) only grow: each step's are read after it, and
    -- pktgen.sh reports the differences.
    xstats(0, "begin")
    xstats(1, "begin")
    -- Both ports send as fast as they can; lcore 1 polls each port for as many frames per
    -- call as it sends (Pktgen's burst, 64).
    local got, took = trial("cable", { 0, 1 }, { 0, 1 }, string.format("size=%d rate=max", size))
    xstats(0, "cable")
    xstats(1, "cable")
    -- A receiver slower than its sender: only port 0 sends, and Pktgen polls port 1 for 16
    -- frames per call (its receive count on a port it also sends from is that port's burst).
    pktgen.set(1, "burst", 16)
    trial("slow_rx", { 0 }, { 0, 1 }, string.format("size=%d rate=max rx_burst=16", size))
    pktgen.set(1, "burst", 64)
    xstats(0, "slow_rx")
    xstats(1, "slow_rx")
    -- A rate both receivers keep up with: start from the rate the slower receiver took
    -- unpaced, as a percentage of the link (Pktgen's own pps at 100%), and halve until every
    -- frame sent arrives.
    pktgen.set("all", "rate", 100)
    local line = pktgen.portInfo(0)[0].info.tx_debug.tx_pps
    local taken = math.min(got[0].ipackets, got[1].ipackets) / took
    local rate = math.max(0.01, math.min(100, 100 * taken / line))
    rate = tonumber(string.format("%.3g", rate))
    for step = 1, tonumber(os.getenv("PG_STEPS") or "8") do
      local t = trial("paced", { 0, 1 }, { 0, 1 },
        string.format("size=%d rate=%g line_pps=%d step=%d", size, rate, line, step), rate)
      if t[0].opackets > 0 and t[1].opackets > 0 and t[1].ipackets == t[0].opackets
          and t[0].ipackets == t[1].opackets then
        break
      end
      rate = tonumber(string.format("%.3g", rate / 2))
    end
    xstats(0, "paced")
    xstats(1, "paced")
  else
    error("PG_MODE must be tx or cable, not " .. mode)
  end
end

local ok, err = pcall(main)
if not ok then
  emit("error %s", tostring(err):gsub("%s+", " "))
end
out:close()
pktgen.quit()
