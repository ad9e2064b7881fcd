"""Check 3, weight fingerprints: every replica's weights (or each shard's copies) bit-identical.

:mod:`.check` is the guard's check (when it compares, and its verdict), :mod:`.divergence` the
comparison of whole replicas (and the public :func:`~.divergence.find_divergent_ranks`),
:mod:`.sharded` the comparison of each shard across its replicas, :mod:`.report` the strict
majority rule that names a copy.
"""
