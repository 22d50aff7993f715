"""The wire: what the kernel saw on the network, held against what loadlab measured.

A packet capture with the kernel's timestamps is a reading of a run that owes nothing to the
load generator: it shows when each request's last byte left and when each token event
arrived, on the user's own engine, where no server log exists. The modules, in the order
the data flows:

- ``capture``: the packet socket (root or CAP_NET_RAW) in a process of its own, writing a
  pcap; ``clock``: the mapping of its CLOCK_REALTIME onto loadlab's perf_counter_ns;
- ``tcp``: each connection's two byte streams rebuilt, with when each byte was readable;
- ``http``: the HTTP/1.1 exchanges and their server-sent events, each event classified;
- ``judge``: a tool's per-request TTFT, ITL and E2E against the wire's, and the verdict;
- ``check``: ``loadlab selftest --wire``, all of the above around a run.

docs/wire.md describes the check and its figures.
"""
