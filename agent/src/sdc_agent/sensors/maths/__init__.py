"""The sensors' maths: the checksum identities every check tests, and their rounding bounds.

:mod:`.abft` has the row-checksum identity of a GEMM (forward, dgrad, wgrad) and of a layer
norm's rows, with the bound that rounding alone may reach; :mod:`._triton_checksum` computes a
GEMM's check as one fused kernel on a GPU. Nothing here knows a layer, a board or a step.
"""
