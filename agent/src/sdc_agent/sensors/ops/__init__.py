"""The op sensors: one module per op family, each checking its op on the values it computes.

GEMMs of ``nn.Linear`` (:mod:`.linear`, with tensor parallel's local shards in
:mod:`.tensor_parallel`), layer norms (:mod:`.norm`), RMSNorms of any class (:mod:`.rmsnorm`),
softmax and log-softmax (:mod:`.softmax`), residual adds (:mod:`.residual`), element-wise ops and
the embedding (:mod:`.elementwise`), attention (:mod:`.attention`) and the loss (:mod:`.loss`);
:mod:`.sites` routes the functions a forward calls to those checked versions, and
:mod:`.recompute` compares activation checkpointing's recomputations with the first forward.
:mod:`.rows` has what the row-invariant checks share. Each builds on
:mod:`sdc_agent.sensors.maths` and :mod:`sdc_agent.sensors.runtime`.
"""
