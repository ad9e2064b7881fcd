"""Check 1, non-finite gradients: each rank's local gradient before the reduction, and the
reduced one after it, every step.

:mod:`.exchange` is the check (the per-step flag reduction and its settling); the flags come from
the taps the parallelism adapter installs, into one :class:`~.stats.GradStatsState`: DDP's comm
hook (:mod:`.comm_hook`) or, for a wrapper without one (FSDP2), post-accumulate-grad taps
(:mod:`.taps`); :mod:`.finiteness` is the one-pass non-finite test they share.
"""
