"""Two real two-rank training scripts that end as torch's examples end (``destroy_process_group()``, no
``os._exit``): an FSDP2 one (``fully_shard`` per layer, checkpoints with ``torch.distributed.checkpoint``) and a DDP
one (rank 0's ``torch.save``). ``--abort after<rank>`` aborts that rank after the last report and the checkpoint,
as torch's race at exit does (``os.abort()`` after ``destroy_process_group()``); ``--abort before<rank>`` aborts it
in the last epoch, before the last report."""

_COMMON = """
import argparse, os, sys
import torch, torch.distributed as dist
from sklearn.datasets import load_breast_cancer
import prefect_hyperband as hb

p = argparse.ArgumentParser(); p.add_argument("--lr", type=float, default=0.05); p.add_argument("--abort", default="")
args = p.parse_args()
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
X, y = load_breast_cancer(return_X_y=True)
X = torch.tensor((X - X.mean(0)) / X.std(0), dtype=torch.float32); y = torch.tensor(y, dtype=torch.float32)
model = torch.nn.Sequential(torch.nn.Linear(30, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
start, resource = int(os.environ["HYPERBAND_START"]), int(os.environ["HYPERBAND_RESOURCE"])


def abort(when):
    if args.abort == f"{when}{rank}":
        print("terminate called without an active exception", file=sys.stderr, flush=True)
        os.abort()


def epochs(model, opt):
    mine = slice(rank, None, world)
    for epoch in range(start + 1, resource + 1):
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(X[mine]).squeeze(1), y[mine])
        opt.zero_grad(); loss.backward(); opt.step()
        with torch.no_grad():
            val = torch.nn.functional.binary_cross_entropy_with_logits(model(X).squeeze(1), y)
        if epoch == resource:
            abort("before")
        hb.report(epoch, val_loss=float(val))
"""

FSDP_SCRIPT = _COMMON + """
import torch.distributed.checkpoint as dcp
from torch.distributed.fsdp import fully_shard
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

for layer in model:
    if isinstance(layer, torch.nn.Linear):
        fully_shard(layer)
fully_shard(model)
opt = torch.optim.SGD(model.parameters(), lr=args.lr)
if os.environ.get("HYPERBAND_CHECKPOINT"):
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=os.environ["HYPERBAND_CHECKPOINT"])
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
epochs(model, opt)
msd, osd = get_state_dict(model, opt)
dcp.save({"model": msd, "optim": osd}, checkpoint_id=os.environ["HYPERBAND_CHECKPOINT_DIR"])
dist.destroy_process_group()
abort("after")
"""

DDP_SCRIPT = _COMMON + """
from torch.nn.parallel import DistributedDataParallel as DDP

if os.environ.get("HYPERBAND_CHECKPOINT"):
    model.load_state_dict(torch.load(os.path.join(os.environ["HYPERBAND_CHECKPOINT"], "model.pt")))
ddp = DDP(model)
opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)
epochs(ddp, opt)
if rank == 0:
    torch.save(model.state_dict(), os.path.join(os.environ["HYPERBAND_CHECKPOINT_DIR"], "model.pt"))
dist.barrier()
dist.destroy_process_group()
abort("after")
"""
