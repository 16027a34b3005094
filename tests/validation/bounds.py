"""Issue 7's bounds of the CPU validation (the mini-engine measured against the simulator)."""

STEP_MAPE_BOUND = 0.20  # mean over steps of |simulated / measured - 1|
E2E_ERROR_BOUND = 0.15  # |simulated / measured - 1| of the whole run's time
