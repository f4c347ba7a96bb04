"""What the lessons say about torch's source, checked against the installed torch: a new torch that changes
one of these paths fails here, and the Going deeper block that cites it is what to update."""

import importlib
import inspect

import torch
from torch.nn.modules import _functions as bn_functions
from torch.nn.parallel import _functions as dp_functions
from torch.nn.parallel import comm


def source(fn) -> str:
    return inspect.getsource(fn)


def test_dataparallel_replicates_every_forward_through_broadcast_and_reduces_gradients_back():
    """02, section 1: the call path DataParallel takes on every forward and its backward."""
    replicate = importlib.import_module("torch.nn.parallel.replicate")
    assert "self.replicate(" in source(torch.nn.DataParallel.forward)
    assert "Broadcast.apply" in source(replicate._broadcast_coalesced_reshape)
    assert "comm.broadcast_coalesced" in source(dp_functions.Broadcast.forward)
    assert "ReduceAddCoalesced.apply" in source(dp_functions.Broadcast.backward)
    assert "comm.reduce_add_coalesced" in source(dp_functions.ReduceAddCoalesced.forward)
    assert "nccl.reduce(" in source(comm.reduce_add)


def test_sync_batchnorm_gathers_statistics_reduces_gradients_and_refuses_cpu_tensors():
    """01, section 2: what SyncBatchNorm communicates, and why the lesson's version is a simulation."""
    forward, backward = source(bn_functions.SyncBatchNorm.forward), source(bn_functions.SyncBatchNorm.backward)
    assert "all_gather" in forward and "torch.cat([mean, invstd, count]" in forward
    assert "all_reduce" in backward and "torch.cat([sum_dy, sum_dy_xmu]" in backward
    assert "SyncBatchNorm expected input tensor to be on GPU" in source(torch.nn.SyncBatchNorm.forward)


def test_swift_gives_each_rank_every_local_world_size_th_gpu_under_ddp_and_device_map():
    """11, section 2: the grouping line helpers.devicemap reproduces, as the installed SWIFT has it."""
    from swift.model import patcher

    from helpers import devicemap

    assert devicemap.SWIFT_GROUP_RULE in inspect.getsource(patcher)
