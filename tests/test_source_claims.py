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


def test_dataparallel_scatters_through_c_scatter_and_replicates_only_to_devices_with_a_slice():
    """02, section 1 and exercise 02.4: scatter hands the tensor to torch._C._scatter (whose C++,
    torch/csrc/cuda/comm.cpp, slices with tensor.chunk when no sizes are given) and forward replicates to
    device_ids[:len(inputs)]. The C++ is not installed; the Python ends of the path are checked here."""
    from torch.nn.parallel import scatter_gather

    assert "self.replicate(self.module, self.device_ids[: len(inputs)])" in source(torch.nn.DataParallel.forward)
    assert "Scatter.apply(target_gpus, None, dim, obj)" in source(scatter_gather.scatter)
    assert "comm.scatter(input, target_gpus, chunk_sizes, ctx.dim, streams)" in source(dp_functions.Scatter.forward)
    assert "torch._C._scatter(tensor, devices, chunk_sizes, dim, streams)" in source(comm.scatter)
    assert [len(c) for c in torch.arange(9).chunk(4)] == [3, 3, 3]  # the rule, on the CPU


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

    rule = "list(range(local_rank, n_gpu, local_world_size))"
    assert f"device_ids = {rule}" in inspect.getsource(patcher)
    assert f"return {rule}" in inspect.getsource(devicemap.swift_devices)


def test_ddp_bucket_capacity_first_iteration_rebuild_and_shape_check_as_04_says():
    """04, section 3: the 25 MiB default with a 1 MiB first bucket, one bucket in iteration 1, the rebuild
    before the second forward, and the same-parameters check before rank 0's broadcast."""
    from torch.nn.parallel import distributed as ddp_module

    assert ddp_module._DEFAULT_BUCKET_CAP_MB == 25
    assert torch.distributed._DEFAULT_FIRST_BUCKET_BYTES == 2**20
    assert "dist._DEFAULT_FIRST_BUCKET_BYTES if is_using_default" in source(ddp_module._BucketCapacityConfig)
    assert "[sys.maxsize]" in source(ddp_module._BucketCapacityConfig.compute_bucket_size_limits)
    assert "self.reducer._rebuild_buckets()" in source(ddp_module.DistributedDataParallel._pre_forward)
    init = source(ddp_module.DistributedDataParallel.__init__)
    assert init.index("_verify_param_shape_across_processes(") < init.index("_sync_module_states(")
    assert "doesn't work with :func:`torch.autograd.grad`" in ddp_module.DistributedDataParallel.__doc__


def test_ddp_buffer_broadcast_follows_the_previous_forward_and_forward_sync_buffers_keeps_the_init_sync():
    """04, section 4: buffers are broadcast at a forward only after a forward with gradients outside no_sync,
    and forward_sync_buffers=False still broadcasts them at construction."""
    from torch.nn.parallel import distributed as ddp_module

    DDP = ddp_module.DistributedDataParallel
    post = source(DDP._post_forward)
    assert "if torch.is_grad_enabled() and self.require_backward_grad_sync:" in post
    assert "self.require_forward_param_sync = False" in post
    will = source(DDP.will_sync_module_buffers)
    assert "self.require_forward_param_sync" in will and "self.forward_sync_buffers" in will
    assert "self.will_sync_module_buffers()" in source(DDP._check_sync_bufs_pre_fwd)
    init = source(DDP.__init__)
    assert "`forward_sync_buffers=False` still syncs buffers at" in init
    assert "broadcast_buffers=init_sync_buffers" in init


def test_swift_turns_five_launch_variables_into_torchrun_flags():
    """06, section 7: SWIFT's CLI passes each of these variables, when set, to torchrun as --<name in lower case>."""
    import re

    from swift.cli import main

    launch = source(main.get_torchrun_args)
    assert "torchrun_args += [f'--{env_key.lower()}', env_val]" in launch
    found = re.search(r"for env_key in \[([^\]]*)\]", launch)
    assert found and set(re.findall(r"'([A-Z_]+)'", found.group(1))) == {
        "NNODES",
        "NODE_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "NPROC_PER_NODE",
    }


def test_zero_redundancy_optimizer_shares_largest_first_and_broadcasts_every_share_after_the_step():
    """11, exercise 11.4's hint: how torch's ZeRO-1 picks each rank's share, and how the shares come back."""
    from torch.distributed.optim import ZeroRedundancyOptimizer as Zero

    partition = source(Zero._partition_parameters)
    assert "key=lambda t: t.numel(), reverse=True" in partition and "self._get_min_index(sizes)" in partition
    assert "self._broadcast_params_from_rank(rank)" in source(Zero._sync_params)
    assert "dist.broadcast(" in source(Zero._broadcast_params_from_rank)
    step = source(Zero.step)
    assert step.index("self._local_step(") < step.index("self._sync_params()")
    assert "Run the optimizer step on this shard only" in source(Zero._local_step)
