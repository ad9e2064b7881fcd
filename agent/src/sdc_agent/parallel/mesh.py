"""The device mesh a sharded model lives on, learned from its parameters: a role per dimension.

Every parameter of an FSDP2 model is a DTensor that carries its ``device_mesh`` and one
placement per mesh dimension. :func:`learn_layout` reads them and gives each dimension of the
mesh a role, which is what the checks need to know (:class:`ShardedLayout`):

* ``replicate``: HSDP's replicas (``Replicate`` on every parameter): ranks that differ only here
  hold the same bits, so check 3 compares them;
* ``shard``: FSDP2's shards (``Shard``, or ``_StridedShard`` where tensor parallelism shards the
  same tensor dimension): each rank holds its own slice and trains on its own micro-batch;
* ``tp``: tensor parallelism (``ColwiseParallel`` / ``RowwiseParallel`` / ``SequenceParallel``:
  ``Shard`` or ``Replicate`` per parameter): the ranks of one TP group compute ONE micro-batch
  together, each on its slice of the weights.

The supported meshes, by dimension names: a 1-D mesh of any name (full sharding),
``("replicate", "shard")`` (HSDP), ``("dp", "tp")`` (FSDP2 x TP) and
``("replicate", "shard", "tp")`` (HSDP x TP); torchtitan's and Accelerate's names are accepted
for the same roles (``dp_replicate`` for ``replicate``; ``fsdp``, ``dp_shard`` and
``dp_shard_cp`` for ``shard``: :data:`HSDP_DIM_NAME_PAIRS`). A parameter may live on a sub-mesh
of the model's mesh (a module left out of the tensor-parallel plan is sharded by ``fully_shard``
on ``mesh["dp"]`` only): its placement on the dimensions it lacks is ``Replicate``. Context
parallel (a ``cp`` dimension) and expert parallel (an ``ep`` dimension; MoE experts on a mesh of
their own) are refused with an error that says what was found: the checks' per-dimension
reasoning would need answers for them that no adapter gives yet (docs/architecture.md, "Tensor
parallelism", says how they would map), with one exception: torchtitan's expert parallel over
HSDP (:data:`EXPERT_MESH_NAMES`: the routed experts on ``("dp_replicate", "efsdp", "ep")``, every
other parameter on the HSDP mesh ``("dp_replicate", "fsdp")`` of the same ranks), which
:func:`learn_layout` reads as the layout ``"hsdp+ep"`` (:mod:`.ep` says what each check does
there). The pipeline dimension never appears on a parameter
(each stage's parameters live on the other dimensions' mesh): the pipeline's adapter composes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from math import prod

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.placement_types import Placement

from ..errors import SdcAgentError

# _StridedShard: FSDP2 shards dim 0 so where TP already shards it (torch 2.13: not a Shard
# subclass); private, but it is what fully_shard writes on every such parameter. Private names
# can move between releases: say so clearly rather than fail the package's import obscurely.
try:
    from torch.distributed.tensor.placement_types import _StridedShard
except ImportError as err:
    raise ImportError(
        f"sdc_agent needs torch.distributed.tensor.placement_types._StridedShard (the placement "
        f"fully_shard writes where tensor parallelism already shards dim 0), which torch "
        f"{torch.__version__} does not have: this torch is not supported (agent/README.md, "
        "'Supported versions')"
    ) from err

REPLICATE = "replicate"
"""HSDP's replica dimension: every rank along it holds the same bits."""
SHARD = "shard"
"""FSDP2's shard dimension: each rank holds its slice and trains on its own micro-batch."""
TP = "tp"
"""The tensor-parallel dimension: the ranks along it compute one micro-batch together."""

HSDP_DIM_NAMES = ("replicate", "shard")
"""The mesh dimension names an HSDP mesh carries, in this order (PyTorch's documentation's)."""
HSDP_DIM_NAME_PAIRS = (HSDP_DIM_NAMES, ("dp_replicate", "fsdp"), ("dp_replicate", "dp_shard_cp"))
"""Every (replicate, shard) naming read as HSDP: PyTorch's, torchtitan's (``ParallelDims``) and
Accelerate's (``ParallelismConfig``). Other names (``("dp", "tp")`` over FSDP2's placements)
are refused: fully_shard over a mesh meant for other parallelism is more likely a mistake than
HSDP."""

DIM_ROLES: dict[str, str] = {
    **{replicate: REPLICATE for replicate, _ in HSDP_DIM_NAME_PAIRS},
    **{shard: SHARD for _, shard in HSDP_DIM_NAME_PAIRS},
    "dp_shard": SHARD,
    "dp": SHARD,
    "tp": TP,
}
"""The role of each mesh dimension name the guard accepts (torchtitan's and Accelerate's names
included). Accelerate's ``dp_shard_cp`` flattens FSDP2's shards with context parallelism: the
parameters cannot tell whether that has more than one rank (Accelerate's integration refuses
context parallelism itself)."""

EP = "ep"
"""The expert-parallel dimension: the ranks along it hold different experts of one MoE layer and
exchange tokens by all-to-all (a role only on the expert mesh, never the model's)."""

EXPERT_MESH_NAMES = ("dp_replicate", "efsdp", "ep")
"""The one expert mesh the guard checks: torchtitan's (``ParallelDims``' sparse mesh, plain
DTensors) under HSDP, the experts' copies along ``dp_replicate``, FSDP2's shards of them along
``efsdp`` and the expert-parallel ranks along ``ep``."""
EXPERT_DENSE_NAMES = ("dp_replicate", "fsdp")
"""The mesh the dense (non-expert) parameters must live on next to :data:`EXPERT_MESH_NAMES`."""
EXPERT_SUPPORTED = (
    "Expert parallel is checked only as torchtitan lays it out over HSDP: the routed experts on "
    "a mesh named ('dp_replicate', 'efsdp', 'ep') with placements (Replicate, Shard or "
    "_StridedShard, Shard(0)), every other parameter on ('dp_replicate', 'fsdp') over the same "
    "ranks (ParallelDims(dp_replicate>=2, dp_shard, ep), tp=1, cp=1, pp=1)"
)
"""What an error about an expert-parallel layout says is supported."""

REFUSED_DIMS: dict[str, str] = {
    "cp": "context parallel",
    "dp_cp": "context parallel",
    "ep": "expert parallel (MoE)",
    "etp": "expert parallel (MoE)",
    "dp_shard_in_ep": "expert parallel (MoE)",
    "dp_shard_mod_ep": "expert parallel (MoE)",
    "pp": "pipeline parallel",
}
"""Dimension names of parallelisms the guard does not check on a parameter mesh."""

EXPERT_LAYOUT = "hsdp+ep"
"""The layout of :data:`EXPERT_MESH_NAMES` next to HSDP."""

LAYOUTS: dict[tuple[str, ...], str] = {
    (SHARD,): "fsdp",
    (REPLICATE, SHARD): "hsdp",
    (SHARD, TP): "fsdp+tp",
    (REPLICATE, SHARD, TP): "hsdp+tp",
}
"""The supported role sequences (outermost dimension first) and the layout each one is."""

SUPPORTED = (
    "a 1-D mesh (FSDP2 full sharding), a 2-D mesh named ('replicate', 'shard') (HSDP), or "
    "tensor parallel composed with them: ('dp', 'tp') or ('replicate', 'shard', 'tp')"
)
"""What an error says is supported."""


class ShardingLayoutError(SdcAgentError, ValueError):
    """The model's parameters are laid out in a way the guard cannot check (the message says
    which and what is supported)."""


@dataclass(frozen=True)
class ShardedLayout:
    """What the mesh says about redundancy and who computes together, learned from the
    parameters; identical on every rank but for this rank's coordinates."""

    kind: str
    """"fsdp" (1-D mesh, full sharding), "hsdp" (replicas x shards), "fsdp+tp" or "hsdp+tp"."""
    replicas: int
    """Copies of each shard (1 without a replicate dimension)."""
    shards: int
    """Ranks per replica, each holding its own slice of every parameter (shard x tp)."""
    replica_index: int
    """This rank's coordinate along the replicate dimension (0 without one)."""
    shard_index: int
    """This rank's position within its replica (row-major over the shard and tp dimensions)."""
    replicas_of_shard: tuple[tuple[int, ...], ...]
    """Per position within a replica: the global ranks holding a copy of that slice, by replica."""
    roles: tuple[str, ...] = (SHARD,)
    """Each mesh dimension's role (:data:`REPLICATE`, :data:`SHARD`, :data:`TP`), outermost first."""
    sizes: tuple[int, ...] = ()
    """Each mesh dimension's size."""
    tp: int = 1
    """Ranks per tensor-parallel group (1 without a tp dimension)."""
    tp_index: int = 0
    """This rank's coordinate along the tp dimension."""
    tp_groups: tuple[tuple[int, ...], ...] = ()
    """Every tensor-parallel group's global ranks, by tp coordinate (empty without tp)."""
    ep: int = 1
    """Ranks per expert-parallel group (1 without expert parallel)."""
    ep_groups: tuple[tuple[int, ...], ...] = ()
    """Every expert-parallel group's global ranks, by ep coordinate (empty without EP): the
    ranks that exchange one MoE layer's tokens by all-to-all, each holding its own experts."""
    expert_params: tuple[str, ...] = ()
    """The names of the parameters on the expert mesh (the routed experts)."""

    @property
    def weight_redundancy(self) -> bool:
        """Whether some slice has two copies to compare (check 3 can run at all)."""
        return self.replicas >= 2

    @property
    def majority_possible(self) -> bool:
        """Whether a strict majority of replicas can name a minority copy (>= 3 replicas)."""
        return self.replicas >= 3

    @property
    def tensor_parallel(self) -> bool:
        """Whether the mesh has a tensor-parallel dimension."""
        return TP in self.roles

    @property
    def expert_parallel(self) -> bool:
        """Whether the routed experts live on an expert-parallel mesh of their own."""
        return bool(self.ep_groups)

    def dims(self) -> dict[str, int]:
        """Each role's size, JSON-ready (``{"replicate": 3, "shard": 1, "tp": 2}``)."""
        return dict(zip(self.roles, self.sizes, strict=True))


def _is_shard(placement: Placement) -> bool:
    return isinstance(placement, (Shard, _StridedShard))


_ROLE_TEST = {
    REPLICATE: (lambda p: p.is_replicate(), "Replicate (HSDP's replicas)"),
    SHARD: (_is_shard, "Shard (FSDP2's shards)"),
    TP: (lambda p: _is_shard(p) or p.is_replicate(), "Shard or Replicate (tensor parallel)"),
}


def _names(mesh: DeviceMesh) -> tuple[str, ...] | None:
    return tuple(mesh.mesh_dim_names) if mesh.mesh_dim_names is not None else None


def _roles(mesh: DeviceMesh) -> tuple[str, ...]:
    """Each dimension's role from its name; raises for a mesh the guard does not check."""
    names = _names(mesh)
    if mesh.ndim == 1:
        return (SHARD,)  # full sharding, whatever the dimension is called
    if names is None:
        raise ShardingLayoutError(
            f"sdc_agent.Guard: the parameters' mesh has {mesh.ndim} unnamed dimensions; name "
            f"them (init_device_mesh(..., mesh_dim_names=...)): supported are {SUPPORTED}"
        )
    refused = [(n, REFUSED_DIMS[n]) for n in names if n in REFUSED_DIMS]
    if refused:
        what = ", ".join(f"{kind} (mesh dimension {name!r})" for name, kind in refused)
        raise ShardingLayoutError(
            f"sdc_agent.Guard: the parameters' mesh {names} includes {what}, which the guard "
            f"does not check yet (docs/architecture.md says how it would map); supported are "
            f"{SUPPORTED}"
        )
    roles = tuple(DIM_ROLES.get(n, "") for n in names)
    if roles not in LAYOUTS:
        raise ShardingLayoutError(
            f"sdc_agent.Guard: unsupported FSDP2 mesh of {mesh.ndim} dimensions named {names}; "
            f"supported are {SUPPORTED}"
        )
    return roles


def _on_root(
    root: DeviceMesh, mesh: DeviceMesh, placements: Sequence[Placement]
) -> tuple[Placement, ...]:
    """A parameter's placements on every dimension of ``root`` (``Replicate`` where its own
    mesh, a sub-mesh of ``root``, lacks the dimension)."""
    if mesh == root:
        return tuple(placements)
    root_names, names = _names(root), _names(mesh)
    if root_names is None or names is None or not set(names) <= set(root_names):
        raise ShardingLayoutError(
            f"sdc_agent.Guard: the parameters live on different device meshes ({root_names} "
            f"and {names}) that are not dimensions of one mesh; the guard supports one mesh per "
            f"model and its sub-meshes ({SUPPORTED}). Expert parallel (MoE experts on a mesh "
            "of their own) is not supported"
        )
    sub = root[names[0]] if len(names) == 1 else root[names]
    if sub != mesh:
        raise ShardingLayoutError(
            f"sdc_agent.Guard: a parameter's mesh {names} holds other ranks than the model "
            f"mesh {root_names}'s dimensions {names}; the guard supports one mesh per model "
            "and its sub-meshes"
        )
    by_name = dict(zip(names, placements, strict=True))
    return tuple(by_name.get(n, Replicate()) for n in root_names)


def learn_layout(params: Sequence[tuple[str, torch.Tensor]]) -> tuple[DeviceMesh, ShardedLayout]:
    """The model's mesh and its layout, from the parameters' DTensor metadata (see the module
    docstring); raises :class:`ShardingLayoutError`, naming what was found, when unsupported.

    Does not check that the mesh covers every rank of the job: a pipeline stage's parameters
    live on a mesh of the other dimensions only, which the pipeline's adapter composes."""
    if not params:
        raise ShardingLayoutError("sdc_agent.Guard: the FSDP2 module has no trainable parameters")
    plain = [name for name, p in params if not isinstance(p, DTensor)]
    sharded = [(name, p) for name, p in params if isinstance(p, DTensor)]
    if plain:
        raise ShardingLayoutError(
            f"sdc_agent.Guard: parameters {plain[:3]} are not sharded (not DTensors); apply "
            "fully_shard to the root module too, so that every parameter is sharded"
        )
    expert = [(name, p) for name, p in sharded if _on_expert_mesh(p.device_mesh)]
    if expert:
        dense = [(name, p) for name, p in sharded if not _on_expert_mesh(p.device_mesh)]
        return _learn_expert_layout(dense, expert)
    # Compared by value (DeviceMesh equality: device type, ranks, dimension names): FSDP2 may
    # hold equal meshes as distinct objects.
    meshes: list[DeviceMesh] = []
    for _, p in sharded:
        if not any(p.device_mesh == seen for seen in meshes):
            meshes.append(p.device_mesh)
    root = max(meshes, key=lambda m: m.ndim)
    if sum(m.ndim == root.ndim for m in meshes) > 1:
        raise ShardingLayoutError(
            f"sdc_agent.Guard: the parameters live on {len(meshes)} different device meshes "
            f"({[_names(m) for m in meshes]}); the guard supports one mesh per model and its "
            f"sub-meshes ({SUPPORTED}). Expert parallel (MoE experts on a mesh of their own) "
            "is not supported"
        )
    roles = _roles(root)
    kind = LAYOUTS[roles]
    names = _names(root) or ("shard",)
    for name, p in sharded:
        on_root = _on_root(root, p.device_mesh, p.placements)
        for dim, (role, placement) in enumerate(zip(roles, on_root, strict=True)):
            accepts, wanted = _ROLE_TEST[role]
            if not accepts(placement):
                raise ShardingLayoutError(
                    f"sdc_agent.Guard: parameter {name} has placement {placement} on mesh "
                    f"dimension {names[dim]!r} of the mesh {_names(root)}, which the guard reads "
                    f"as {kind.upper()}, expecting {wanted} there; supported are {SUPPORTED}"
                )
    return root, _layout_of(root, roles, kind)


def _layout_of(mesh: DeviceMesh, roles: tuple[str, ...], kind: str) -> ShardedLayout:
    """This rank's :class:`ShardedLayout` on ``mesh`` whose dimensions have ``roles``."""
    grid: torch.Tensor = mesh.mesh
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        raise ShardingLayoutError("sdc_agent.Guard: this rank is not part of the model's mesh")
    replicas = grid.shape[0] if roles[0] == REPLICATE else 1
    per_replica = grid.reshape(replicas, -1).tolist()  # [replica][position in the replica]
    replica_index = coordinate[0] if roles[0] == REPLICATE else 0
    inner = coordinate[1:] if roles[0] == REPLICATE else coordinate
    inner_sizes = list(grid.shape[1:] if roles[0] == REPLICATE else grid.shape)
    shard_index = 0
    for size, c in zip(inner_sizes, inner, strict=True):
        shard_index = shard_index * size + c
    tp, tp_index = 1, 0
    tp_groups: tuple[tuple[int, ...], ...] = ()
    if TP in roles:
        tp = grid.shape[-1]
        tp_index = coordinate[-1]
        tp_groups = tuple(tuple(row) for row in grid.reshape(-1, tp).tolist())
    return ShardedLayout(
        kind=kind,
        replicas=replicas,
        shards=prod(inner_sizes),
        replica_index=replica_index,
        shard_index=shard_index,
        replicas_of_shard=tuple(
            tuple(row[s] for row in per_replica) for s in range(len(per_replica[0]))
        ),
        roles=roles,
        sizes=tuple(grid.shape),
        tp=tp,
        tp_index=tp_index,
        tp_groups=tp_groups,
    )


def _on_expert_mesh(mesh: DeviceMesh) -> bool:
    """Whether ``mesh`` has an expert-parallel dimension (by name: :data:`REFUSED_DIMS`')."""
    return any(REFUSED_DIMS.get(n) == REFUSED_DIMS[EP] for n in _names(mesh) or ())


def _refuse_expert(found: str) -> ShardingLayoutError:
    return ShardingLayoutError(
        f"sdc_agent.Guard: {found}, which the guard does not check yet. {EXPERT_SUPPORTED} "
        "(docs/usage/ep.md)"
    )


def _learn_expert_layout(
    dense: Sequence[tuple[str, DTensor]], expert: Sequence[tuple[str, DTensor]]
) -> tuple[DeviceMesh, ShardedLayout]:
    """The layout ``"hsdp+ep"``: the dense parameters' HSDP mesh and layout, with the expert
    mesh's EP groups. Refuses, by the dimension found, every other expert-parallel layout.

    Why the dense layout answers for the experts too: both meshes unflatten the same ranks with
    ``dp_replicate`` outermost, so the ranks at one position within a replica hold the same
    dense shard AND the same expert shard (the same experts, the same efsdp slice of them): the
    experts' expert-data-parallel copies are the dense shards' replicas."""
    expert_names = {_names(p.device_mesh) for _, p in expert}
    other = sorted(str(n) for n in expert_names if n != EXPERT_MESH_NAMES)
    if other:
        dims = sorted({n for names in expert_names for n in names or () if n in REFUSED_DIMS})
        raise _refuse_expert(
            f"the expert parameters live on a mesh {', '.join(other)} (expert parallel, mesh "
            f"dimensions {dims})"
        )
    if not dense:
        raise _refuse_expert("every parameter lives on the expert mesh (no dense HSDP mesh)")
    mesh, layout = learn_layout(dense)
    if layout.kind != "hsdp" or _names(mesh) != EXPERT_DENSE_NAMES:
        raise _refuse_expert(
            f"expert parallel is composed with a dense {layout.kind.upper()} mesh "
            f"{_names(mesh)} (tensor parallel with experts, or no replicas)"
        )
    experts: list[DeviceMesh] = []
    for _, p in expert:
        if not any(p.device_mesh == seen for seen in experts):
            experts.append(p.device_mesh)
    if len(experts) > 1:
        raise _refuse_expert(f"the experts live on {len(experts)} different expert meshes")
    emesh = experts[0]
    if (
        emesh.device_type != mesh.device_type
        or emesh.mesh.flatten().tolist() != mesh.mesh.flatten().tolist()
        or emesh.mesh.shape[0] != mesh.mesh.shape[0]
    ):
        raise _refuse_expert(
            f"the expert mesh {tuple(emesh.mesh.shape)} does not lay out the dense mesh "
            f"{tuple(mesh.mesh.shape)}'s ranks with the same replicas"
        )
    for name, p in expert:
        replicate, efsdp, ep = p.placements
        if not (
            replicate.is_replicate()
            and (_is_shard(efsdp) or efsdp.is_replicate())
            and isinstance(ep, Shard)
            and ep.dim == 0
        ):
            raise _refuse_expert(
                f"expert parameter {name} has placements {tuple(p.placements)} on "
                f"{EXPERT_MESH_NAMES}"
            )
    ep_size = emesh.mesh.shape[-1]
    return mesh, replace(
        layout,
        kind=EXPERT_LAYOUT,
        ep=ep_size,
        ep_groups=tuple(tuple(row) for row in emesh.mesh.reshape(-1, ep_size).tolist()),
        expert_params=tuple(name for name, _ in expert),
    )
