"""A DDP training script under sdc-guard, ready for torchrun and a Kubeflow PyTorchJob.

    torchrun --nnodes 3 --nproc-per-node 8 ... train_ddp.py --steps 2000
    # a fire drill: GPU rank 11 multiplies one activation by 1000 from step 300 on
    torchrun ... train_ddp.py --fault scale --fault-rank 11 --fault-step 300

On one machine without GPUs (gloo), pretending 6 processes are 3 nodes of 2:

    torchrun --standalone --nproc-per-node 6 agent/examples/train_ddp.py \
        --simulate-nodes 3 --peer-offset 2 --steps 60 --audit-every 10 \
        --fault scale --fault-rank 3 --fault-step 25      # names rank 3; torchrun exits 1

(each worker exits 3, or dies of the SIGTERM torchrun sends once the first has exited:
docs/agent-install.md, section 8)

The restart after an SDC stop (docs/recovery.md): with --ckpt-every the guard records every alarm
in --ckpt-dir, and --resume auto loads the newest checkpoint no recorded alarm's suspect window
covers (sdc.clean_resume_step), so the same command line resumes safely:

    torchrun ... train_ddp.py --ckpt-every 10 --ckpt-dir /tmp/ckpt --fault scale --fault-step 25
    torchrun ... train_ddp.py --ckpt-every 10 --ckpt-dir /tmp/ckpt --resume auto   # from step 19

What it shows:
- rebuild_batch(step, rank): the exact micro-batch any rank trained on at any step, from a
  seeded permutation of a fixed dataset (what DistributedSampler with set_epoch does), so a
  peer can replay it;
- the guard with the CloudWatch publisher when SDC_CLUSTER_NAME is set (else no publishing);
- checkpoints tagged with the guard's last passing checks, and every alarm recorded next to them;
- the restart: resume from the checkpoint sdc.clean_resume_step chooses, verified by the guard;
- exit code 3 (sdc_agent.exit_on_alarm) when a check fails, so the restart policy can tell an
  SDC stop from a crash.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import sdc_agent as sdc
from sdc_agent import faults
from sdc_agent.exit import exit_on_alarm

logger = logging.getLogger("train_ddp")


class SeededDataset:
    """A fixed classification dataset and the rule that assigns micro-batches to ranks.

    Batches are a pure function of (step, rank): epoch ``e`` is a permutation seeded with
    ``seed + e``; step ``s`` of rank ``r`` takes slice ``[(s * world + r) * b, ... + b)`` of it.
    Replace the tensors with your dataset and keep the rule.
    """

    def __init__(self, *, size: int, dim: int, classes: int, seed: int, batch: int, world: int):
        """Generate ``size`` samples of a seeded Gaussian mixture (the same on every rank)."""
        g = torch.Generator().manual_seed(seed)
        centers = torch.randn(classes, dim, generator=g) * 2.0
        self.y = torch.randint(0, classes, (size,), generator=g)
        self.x = centers[self.y] + torch.randn(size, dim, generator=g)
        self.seed, self.batch, self.world = seed, batch, world
        self.steps_per_epoch = size // (batch * world)
        if self.steps_per_epoch < 1:
            raise ValueError(f"dataset of {size} samples is smaller than one global batch")

    def batch_of(self, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The micro-batch global ``rank`` trains on at ``step``."""
        epoch, within = divmod(step, self.steps_per_epoch)
        order = torch.randperm(
            len(self.y), generator=torch.Generator().manual_seed(self.seed + epoch)
        )
        start = (within * self.world + rank) * self.batch
        index = order[start : start + self.batch]
        return self.x[index], self.y[index]


class MLP(nn.Module):
    """A small classifier; ``net.2`` is the layer the drill's activation faults hit."""

    def __init__(self, dim: int, hidden: int, classes: int) -> None:
        """Three linear layers with GELU."""
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(dim, hidden),
            nn.GELU(),
            nn.Linear(hidden, hidden),
            nn.GELU(),
            nn.Linear(hidden, classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits."""
        return self.net(x)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line flags (training, checks and the fault drill)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=500, help="training steps")
    p.add_argument("--batch", type=int, default=32, help="micro-batch size per rank")
    p.add_argument("--seed", type=int, default=0, help="data and initialisation seed")
    p.add_argument("--audit-every", type=int, default=50, help="ring replay audit period (0: off)")
    p.add_argument("--check-every", type=int, default=50, help="weight check period (0: off)")
    p.add_argument("--ckpt-every", type=int, default=0, help="checkpoint period (0: never)")
    p.add_argument(
        "--ckpt-dir",
        default="checkpoints",
        help="where rank 0 saves checkpoints and the guard records alarms (shared storage)",
    )
    p.add_argument(
        "--resume",
        choices=["none", "auto"],
        default="none",
        help="auto: resume from the newest checkpoint no recorded alarm's suspect window covers",
    )
    p.add_argument(
        "--peer-offset",
        type=int,
        default=int(os.environ.get("LOCAL_WORLD_SIZE", "8")),
        help="replay partner distance; GPUs per node (default LOCAL_WORLD_SIZE)",
    )
    p.add_argument(
        "--fault",
        choices=["none", "scale", "nan", "weight-flip"],
        default="none",
        help="fire drill: make one rank compute wrong on purpose",
    )
    p.add_argument("--fault-rank", type=int, default=1, help="the drill's faulty global rank")
    p.add_argument("--fault-step", type=int, default=100, help="the step the drill fault starts")
    p.add_argument(
        "--simulate-nodes",
        type=int,
        default=0,
        help="local drills only: pretend the ranks run on this many nodes (sets NODE_NAME)",
    )
    p.add_argument(
        "--publish",
        choices=["auto", "cloudwatch", "none"],
        default="auto",
        help="auto: CloudWatch when SDC_CLUSTER_NAME is set",
    )
    return p.parse_args(argv)


def make_publisher(choice: str) -> sdc.Publisher | None:
    """The CloudWatch publisher on every rank (the guard calls it from DP rank 0 only)."""
    if choice == "none" or (choice == "auto" and not os.environ.get("SDC_CLUSTER_NAME")):
        return None
    from sdc_agent.publish import CloudWatchPublisher

    return CloudWatchPublisher()  # names from SDC_CLUSTER_NAME / SDC_JOB_NAME, see the docs


def make_drill_fault(args: argparse.Namespace) -> faults.Fault | None:
    """The injector the --fault flags ask for."""
    when = {"rank": args.fault_rank, "step": args.fault_step}
    if args.fault == "scale":
        return faults.ScaleOutputElement("net.2", factor=1000.0, **when)
    if args.fault == "nan":
        return faults.NaNOutputElement("net.2", persistent=False, **when)
    if args.fault == "weight-flip":
        return faults.FlipWeightBit("net.0.weight", bit=27, **when)
    return None


def checkpoint_path(ckpt_dir: str, step: int) -> Path:
    """The checkpoint saved after ``step``'s update."""
    return Path(ckpt_dir, f"step{step:08d}.pt")


def resume_step(ckpt_dir: str, *, announce: bool) -> int | None:
    """The checkpoint to resume from: the newest that no recorded alarm's window covers.

    Called on every rank (they read the same shared directory); the guard checks the choice
    again at start, collectively, and refuses a checkpoint inside a window. ``announce``: log
    the decision (one rank).
    """
    steps = sorted(int(p.stem.removeprefix("step")) for p in Path(ckpt_dir).glob("step*.pt"))
    if not steps:
        return None
    if announce:  # the reasoning, with every refused checkpoint and the alarm that covers it
        decision = sdc.explain_resume(steps, ckpt_dir)
        logger.info("resume: %s; refused: %s", decision.reason, decision.refused or "none")
    return sdc.clean_resume_step(steps, ckpt_dir)  # None: restart from the initial weights


def leave(code: int) -> NoReturn:
    """Exit now, without tearing anything down: process-group, DDP and gloo destructors can abort
    or hang (seen with gloo: "terminate called without an active exception", and ranks hung
    while main's frame released the model after a run with checkpoints). Everything that
    matters was flushed before."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: list[str] | None = None) -> NoReturn:
    """Train; exit 0 when done, 3 when the guard stopped the job."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.simulate_nodes:
        # The replay audit needs each pair on different nodes; one machine is one node unless
        # we say otherwise. Never use this in a real job: NODE_NAME comes from the downward API.
        per_node = max(1, int(os.environ["WORLD_SIZE"]) // args.simulate_nodes)
        os.environ["NODE_NAME"] = f"local-node-{int(os.environ['RANK']) // per_node}"
    use_cuda = torch.cuda.is_available()
    if use_cuda:
        # Deterministic cuBLAS for bitwise audits must be set before the first matmul; the
        # PyTorchJob sets it too (pytorchjob.yaml).
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")

    data = SeededDataset(
        size=65_536, dim=32, classes=8, seed=args.seed, batch=args.batch, world=world
    )
    torch.manual_seed(args.seed)  # identical initial weights on every rank
    model = nn.parallel.DistributedDataParallel(MLP(32, 256, 8).to(device))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    start = 0
    resume = resume_step(args.ckpt_dir, announce=rank == 0) if args.resume == "auto" else None
    if resume is not None:
        state = torch.load(checkpoint_path(args.ckpt_dir, resume), map_location=device)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = resume + 1  # the checkpoint holds the weights after step `resume`'s update

    def compute_loss(m: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(m(x.to(device)), y.to(device))

    guard = sdc.Guard(
        model,
        optimizer,
        compute_loss=compute_loss,
        rebuild_batch=data.batch_of,
        schedule=sdc.Schedule(
            audit_every=args.audit_every,
            check_every=args.check_every,
            ckpt_every=args.ckpt_every,
            peer_offset=args.peer_offset,
        ),
        publisher=make_publisher(args.publish),
        # Alarms go next to the checkpoints, where the next start's resume reads them.
        alarm_dir=args.ckpt_dir if args.ckpt_every or args.resume == "auto" else None,
    )
    fault = make_drill_fault(args)
    if fault is not None:
        fault.attach(guard)

    def save_checkpoint(step: int, tags: dict[str, Any]) -> None:
        if rank == 0:
            Path(args.ckpt_dir).mkdir(parents=True, exist_ok=True)
            state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}
            # Written whole or not at all: a job stopped mid-save must not leave a truncated
            # newest checkpoint for the restart to choose.
            final = checkpoint_path(args.ckpt_dir, step)
            partial = final.with_name(f".{final.name}.tmp")
            torch.save({**state, "sdc": tags}, partial)
            os.replace(partial, final)

    batches = (data.batch_of(step, rank) for step in range(start, args.steps))
    # From a checkpoint, train() first refuses one inside a recorded alarm's window
    # (sdc.UnsafeResumeError) and compares every replica's loaded weights.
    alarm = guard.train(batches, save_checkpoint=save_checkpoint, start_step=start)
    if alarm is not None:
        exit_on_alarm(alarm)  # every rank: flush, exit code 3 (or torchrun's SIGTERM first)
    guard.publisher.flush(30)
    dist.destroy_process_group()
    leave(0)  # here, while the model, the optimizer and the guard are still referenced


if __name__ == "__main__":
    main()
