-- Measurements that scripts/pktgen.sh asks Pktgen-DPDK (23.06, built with Lua) to make; run
-- as `pktgen ... -- -f pktgen.lua`. Parameters come from the environment (PG_*), results go
-- to PG_OUT as lines of `key=value` words, one line per trial, for pktgen.sh to tabulate.
--
-- Counts are the ports' own (rte_eth_stats_get through DPDK telemetry, PG_TELEMETRY), read
-- when the script asks and stamped with the time they were read, not Pktgen's once-a-second
-- copies. A trial's rate is counted over a window that opens once every sender has sent its
-- first frames: at each start Pktgen first rebuilds every mbuf of its pool, which takes a
-- second or more and is no part of the driver's rate.

local out = assert(io.open(assert(os.getenv("PG_OUT"), "PG_OUT unset"), "w"))
local mode = os.getenv("PG_MODE") or "tx"
local secs = tonumber(os.getenv("PG_SECS") or "5")
local rounds = tonumber(os.getenv("PG_ROUNDS") or "3")
-- Pktgen's burst (packets per tx_burst call, and per rx_burst call on a port that sends);
-- unset, Pktgen's own.
local burst = tonumber(os.getenv("PG_BURST") or "")
-- A command to which `stats P ...` or `xstats P` is appended: a telemetry client of this
-- Pktgen process (see pktgen.sh).
local telemetry = assert(os.getenv("PG_TELEMETRY"), "PG_TELEMETRY unset")

local function emit(fmt, ...)
  out:write(string.format(fmt, ...), "\n")
  out:flush()
end

-- The ports' counters now: the time they were read (seconds, monotonic) and, per port, a
-- table of opackets, ipackets, imissed, ierrors, oerrors, rx_nombuf; `cpu` holds the seconds
-- the polling lcore's thread has run (-1 if unknown).
local function live(ports)
  local p = io.popen(telemetry .. " stats " .. table.concat(ports, " "))
  local t, got = nil, {}
  for line in p:lines() do
    local time = line:match("^time (%S+)$")
    local cpu = line:match("^cpu (%S+)$")
    if time then
      t = tonumber(time)
    elseif cpu then
      got.cpu = tonumber(cpu)
    else
      local port, rest = line:match("^port (%d+) (.*)$")
      if port then
        local c = {}
        for k, v in rest:gmatch("(%S+)=(%d+)") do
          c[k] = tonumber(v)
        end
        got[tonumber(port)] = c
      end
    end
  end
  p:close()
  assert(t, "no answer from DPDK telemetry (" .. telemetry .. ")")
  for _, port in ipairs(ports) do
    assert(got[port], "telemetry gave no counters of port " .. port)
  end
  return t, got
end

local COUNTERS = { "opackets", "ipackets", "imissed", "ierrors", "oerrors", "rx_nombuf" }

local function delta(a, b)
  local d = {}
  for _, k in ipairs(COUNTERS) do
    d[k] = b[k] - a[k]
  end
  return d
end

local function same(a, b, ports)
  for _, p in ipairs(ports) do
    for _, k in ipairs(COUNTERS) do
      if a[p][k] ~= b[p][k] then
        return false
      end
    end
  end
  return true
end

-- The device's counters of `port` as one result line (the hca_* drop causes among them).
local function xstats(port, tag)
  local p = io.popen(telemetry .. " xstats " .. port)
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

-- Sends on `senders` (unpaced unless `rate` is given, in percent of the link) and emits one
-- line per port in `ports`: its rates over the measuring window and its totals from start
-- until the ports stood still after stop. Returns the rates and the totals, per port.
local function trial(kind, senders, ports, extra, rate)
  for _, p in ipairs(senders) do
    pktgen.set(p, "rate", rate or 100)
  end
  if not rate then
    -- Pktgen paces a port by its link speed (net_null reports 10G, ours 40G); one cycle
    -- between bursts takes the pacing away, so each port sends as fast as it can. An lcore
    -- serving several ports paces them all by its first port's setting: set it on all.
    pktgen.set("all", "cycles", 1)
  end
  for _, p in ipairs(ports) do
    pktgen.clear(p)
  end
  local t0, base = live(ports)
  for _, p in ipairs(senders) do
    pktgen.start(p)
  end
  if not rate then
    -- Starting may pace the lcore by the first port's link speed again (from the second trial
    -- of a port on, its 40G line rate at 512 B and more): take the pacing away once more.
    pktgen.set("all", "cycles", 1)
  end
  -- The window opens once every sender has sent (Pktgen has built its packets).
  local t_a, a
  repeat
    pktgen.delay(20)
    t_a, a = live(ports)
    local all = true
    for _, p in ipairs(senders) do
      all = all and a[p].opackets > base[p].opackets
    end
    if not all and t_a - t0 > 60 then
      error(kind .. " " .. extra .. ": a port sent nothing for 60 s after start")
    end
  until all
  -- pktgen.delay sleeps in 10 ms steps that each overrun on a busy machine: watch the clock.
  local t_b, b = live(ports)
  while t_b - t_a < secs do
    pktgen.delay(math.max(10, math.min(500, math.floor((secs - (t_b - t_a)) * 900))))
    t_b, b = live(ports)
  end
  for _, p in ipairs(senders) do
    pktgen.stop(p)
  end
  -- Totals once nothing moves any more (frames in flight delivered or dropped).
  local _, c = live(ports)
  local quiet = false
  for _ = 1, 100 do
    pktgen.delay(200)
    local _, d = live(ports)
    if same(c, d, ports) then
      quiet = true
      break
    end
    c = d
  end
  local rates, totals = {}, {}
  for _, p in ipairs(ports) do
    local w, tot = delta(a[p], b[p]), delta(base[p], c[p])
    totals[p] = tot
    local secs_w = t_b - t_a
    rates[p] = { tx = w.opackets / secs_w, rx = w.ipackets / secs_w }
    -- The share of the window the polling lcore ran: on a busy machine it is not 1, and
    -- packets per second of it is what the lcore would do with a core of its own.
    local cpu = (a.cpu >= 0 and b.cpu >= 0) and (b.cpu - a.cpu) / secs_w or -1
    emit("%s %s port=%d first_frame_after=%.3f window=%.3f lcore_share=%.3f tx_pps=%.0f "
      .. "rx_pps=%.0f opackets=%d ipackets=%d imissed=%d ierrors=%d oerrors=%d rx_nombuf=%d "
      .. "settled=%s",
      kind, extra, p, t_a - t0, secs_w, cpu, rates[p].tx, rates[p].rx, tot.opackets,
      tot.ipackets, tot.imissed, tot.ierrors, tot.oerrors, tot.rx_nombuf, tostring(quiet))
  end
  return rates, totals
end

local function main()
  pktgen.screen("off")
  -- Let the links come up before the first rate is set (Pktgen paces by link speed).
  pktgen.delay(1000)
  if burst then
    pktgen.set("all", "burst", burst)
  end
  local sizes = {}
  for s in (os.getenv("PG_SIZES") or "64"):gmatch("%d+") do
    sizes[#sizes + 1] = tonumber(s)
  end
  if mode == "tx" then
    -- The ports of PG_PORTS take turns, in that order (pktgen.sh: port 0 ours, port 1 net_null).
    local ports = {}
    for p in (os.getenv("PG_PORTS") or "0 1"):gmatch("%d+") do
      ports[#ports + 1] = tonumber(p)
    end
    for _, size in ipairs(sizes) do
      pktgen.set("all", "size", size)
      for r = 1, rounds do
        for _, p in ipairs(ports) do
          trial("tx", { p }, { p }, string.format("size=%d round=%d", size, r))
        end
      end
    end
    -- Every port's counters at the end (pktgen.sh reads port 0's, c-mlx4-bench.sh all).
    for _, p in ipairs(ports) do
      xstats(p, "end")
    end
  elseif mode == "cable" then
    local size = sizes[1]
    pktgen.set("all", "size", size)
    -- The device's counters (hca_* causes) only grow: each step's are read after it, and
    -- pktgen.sh reports the differences.
    xstats(0, "begin")
    xstats(1, "begin")
    -- Both ports send as fast as they can; lcore 1 polls each port for as many frames per
    -- call as it sends (Pktgen's burst, 64).
    local r = trial("cable", { 0, 1 }, { 0, 1 }, string.format("size=%d rate=max", size))
    xstats(0, "cable")
    xstats(1, "cable")
    -- A receiver slower than its sender: only port 0 sends, and Pktgen polls port 1 for 16
    -- frames per call (its receive count on a port it also sends from is that port's burst).
    pktgen.set(1, "burst", 16)
    trial("slow_rx", { 0 }, { 0, 1 }, string.format("size=%d rate=max rx_burst=16", size))
    pktgen.set(1, "burst", burst or 64)
    xstats(0, "slow_rx")
    xstats(1, "slow_rx")
    -- A rate both receivers keep up with: start from the rate the slower receiver took
    -- unpaced, as a percentage of the link (Pktgen's own pps at 100%), and halve until every
    -- frame sent arrives.
    pktgen.set("all", "rate", 100)
    local line = pktgen.portInfo(0)[0].info.tx_debug.tx_pps
    local rate = math.max(0.01, math.min(100, 100 * math.min(r[0].rx, r[1].rx) / line))
    rate = tonumber(string.format("%.3g", rate))
    for step = 1, tonumber(os.getenv("PG_STEPS") or "8") do
      local _, t = trial("paced", { 0, 1 }, { 0, 1 },
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
  emit("error %s", (tostring(err):gsub("%s+", " ")))
end
out:close()
pktgen.quit()
