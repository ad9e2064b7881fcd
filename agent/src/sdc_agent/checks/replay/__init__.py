"""Check 2, the ring replay audit: every rank recomputes another rank's micro-batch on another node.

:mod:`.audit` runs it (replays as collective rows, the audit, the confirmations, the verdicts);
:mod:`.attribution` is its pure logic (mismatches, culprits, who confirms whom);
:mod:`.replayer` recomputes one micro-batch alone (DDP's bare module) and :mod:`.collective`
through a sharded module, every rank at once (FSDP2); :mod:`.environment` is the seeded RNG and
deterministic kernels an audited step runs with; :mod:`.accumulation` isolates the audited
micro-batch's gradient under gradient accumulation.
"""
