"""Pure status logic: which pool owns which node, what pools and shares report, what pods
hold, and how conditions move. Takes frozen views, returns decisions and patches; no I/O,
no clock (callers pass the time)."""
