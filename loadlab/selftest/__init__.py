"""``loadlab selftest``: loadlab's timing held against a server that logs its own truth
(``fixed_server``, a fixed-schedule server that stamps arrivals with the kernel's clock)."""
