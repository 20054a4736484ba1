"""The expert-parallel MoE layer (libmoekit_ep, docs/ep.md) from PyTorch: the router's R*E experts spread over the R
ranks of a communicator, rank r holding experts r*E .. (r+1)*E - 1 and its own tokens.

    import torch.distributed as dist, moekit.ep
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    comm = moekit.ep.Communicator.from_process_group()          # the group's own ncclComm_t, borrowed
    layer = moekit.ep.EPMoELayer(1024, 512, experts=8, top_k=4, comm=comm, max_tokens=4096, device="cuda",
                                 dtype=torch.bfloat16)           # 8 experts per rank, 8 R in the router
    out = layer(x)                                               # x [..., 1024], this rank's tokens
    out.float().square().sum().backward()
    dist.all_reduce(layer.w_router.grad)                         # the router is data-parallel

Every call is collective: every rank of the communicator calls the forward, and the backward, in the same order,
with the same options and max_tokens (the plan descriptor must agree everywhere), as with any torch.distributed
collective. A bad argument is raised (MoekitError naming it) before the call communicates; the other ranks then wait
in the exchange, so a program checks its arguments identically on every rank.

The layer is a torch.autograd.Function, not a torch.library custom op: the communicator is a live object shared
with the other ranks, which an op schema cannot carry and torch.compile could not trace or replay safely. Its
backward always computes the input and every weight gradient (handing back those autograd asks for), because both
requests must agree on every rank and one rank's graph cannot know the others'.
"""
import collections
import ctypes
import threading
import weakref

import torch

from . import _capi, _ep_capi, _runtime, functional
from .modules import MoELayer

MODES = {"exact": _ep_capi.EXACT, "capacity": _ep_capi.CAPACITY}

EPRouting = collections.namedtuple("EPRouting", ["scores", "indices", "counts", "dropped"])
EPRouting.__doc__ = ("The expert-parallel layer's routing on this rank: scores [T, K] (fp32; fp64 in an fp64 layer) "
                     "and indices [T, K] int32 (global expert ids) in selection order, counts [R*E] int32 (this "
                     "rank's pairs per expert, before dropping), dropped [1] int32 (this rank's pairs dropped over "
                     "the capacity; 0 in the exact mode).")


def has_nccl():
    """Whether the loaded libmoekit_ep has the NCCL exchange (Communicator.from_process_group, from_nccl)."""
    return bool(_ep_capi.load().moekit_ep_has_nccl())


class _Plan:
    def __init__(self, raw, workspace_bytes, saved_bytes):
        self.raw, self.workspace_bytes, self.saved_bytes = raw, workspace_bytes, saved_bytes


def _release(plans, comm, handle):
    lib = _ep_capi.load()
    for plan in plans.values():
        lib.moekit_ep_plan_destroy(plan.raw)
    plans.clear()
    lib.moekit_ep_comm_destroy(comm)
    _capi.load().moekit_handle_destroy(handle)


class Communicator:
    """One rank's moekit_ep_comm_t, with the moekit handle and the plans of the layers run over it. Made by
    from_process_group, from_nccl or LocalGroup.communicator; `rank` and `ranks` come from the library. Each
    communicator has a handle of its own, so that the ranks of one process (a LocalGroup's) call at once."""

    def __init__(self, raw, device, owner):
        # owner: what must outlive the communicator (its local group, or the process group whose NCCL comm it is).
        lib = _ep_capi.load()
        rank, ranks = ctypes.c_int32(), ctypes.c_int32()
        _ep_capi.check(lib.moekit_ep_comm_rank(raw, ctypes.byref(rank), ctypes.byref(ranks)))
        self.raw, self.device, self._owner = raw, device, owner
        self.rank, self.ranks = rank.value, ranks.value
        self._handle = _runtime.Handle(device)
        self._plans = {}
        self._plans_lock = threading.Lock()
        weakref.finalize(self, _release, self._plans, raw, self._handle.raw)

    @classmethod
    def from_nccl(cls, nccl_comm, device=None, owner=None):
        """A communicator over a raw ncclComm_t (its address, an int), borrowed: it must stay alive as long as
        this object, which keeps `owner` for that. For CUDA tensors on `device` (default: the current one).
        NotSupportedError where libmoekit_ep was built without NCCL (has_nccl())."""
        raw = ctypes.c_void_p()
        _ep_capi.check(_ep_capi.load().moekit_ep_comm_create_nccl(ctypes.c_void_p(int(nccl_comm)), ctypes.byref(raw)))
        device = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
        return cls(raw, device, owner)

    @classmethod
    def from_process_group(cls, group=None):
        """This process's rank of a torch.distributed NCCL process group (default: the default group), over the
        group's own NCCL communicator for the current CUDA device (ProcessGroupNCCL._comm_ptr()): the ranks and
        their order are the group's. That communicator exists from init_process_group(..., device_id=device) on,
        or else after the group's first collective on the device. The NCCL library is torch's: the one libtorch
        loaded (libnccl.so.2) serves libmoekit_ep too."""
        import torch.distributed as dist

        group = group if group is not None else dist.distributed_c10d._get_default_group()
        device = torch.device("cuda", torch.cuda.current_device())
        backend = group._get_backend(device)
        comm_ptr = getattr(backend, "_comm_ptr", None)
        if comm_ptr is None:
            raise ValueError("group: its backend for %s (%s) is not ProcessGroupNCCL with _comm_ptr()"
                             % (device, type(backend).__name__))
        pointer = comm_ptr()
        if not pointer:
            raise ValueError("group: it has no NCCL communicator on %s yet; pass device_id to init_process_group, "
                             "or run one collective of the group on this device first" % device)
        return cls.from_nccl(pointer, device, owner=group)

    def plan(self, fields, mode, capacity):
        """The cached plan for these moekit_moe_desc_t fields (the layer on this rank), mode and capacity."""
        key = (tuple(sorted(fields.items())), mode, capacity)
        with self._plans_lock:
            if key not in self._plans:
                lib = _ep_capi.load()
                desc = _ep_capi.initialised(_ep_capi.EpDesc, "moekit_ep_desc_init")
                for name, value in fields.items():
                    setattr(desc.layer, name, value)
                desc.mode, desc.capacity = mode, capacity
                raw = ctypes.c_void_p()
                _ep_capi.check(lib.moekit_ep_plan_create(self._handle.raw, self.raw, ctypes.byref(desc),
                                                         ctypes.byref(raw)))
                workspace, saved = ctypes.c_size_t(), ctypes.c_size_t()
                _ep_capi.check(lib.moekit_ep_plan_sizes(raw, ctypes.byref(workspace), ctypes.byref(saved)))
                self._plans[key] = _Plan(raw, workspace.value, saved.value)
            return self._plans[key]

    def run(self, function, plan, args, saved, workspace):
        """moekit_ep_forward or _backward under the handle's lock, on the current stream of the device."""
        pointer = functional._pointer
        with self._handle.lock:
            _ep_capi.check(getattr(_ep_capi.load(), function)(
                plan.raw, ctypes.byref(args), pointer(saved), saved.numel(), pointer(workspace), workspace.numel(),
                _runtime.stream_for(self.device)))

    def __repr__(self):
        return "Communicator(rank=%d, ranks=%d, device=%s)" % (self.rank, self.ranks, self.device)


class LocalGroup:
    """`ranks` ranks of this process exchanging through host memory, for CPU tensors (the reference backend): tests
    and debugging a multi-rank layer without GPUs. communicator(r) is rank r's; each rank runs in a thread of its
    own, the R threads calling the layer at once (their calls meet in the exchange; ctypes releases the GIL while
    the library runs)."""

    def __init__(self, ranks):
        lib = _ep_capi.load()
        raw = ctypes.c_void_p()
        _ep_capi.check(lib.moekit_ep_local_group_create(int(ranks), ctypes.byref(raw)))
        self.raw, self.ranks = raw, int(ranks)
        # The communicators keep the group alive, so it is destroyed after them.
        weakref.finalize(self, lib.moekit_ep_local_group_destroy, raw)

    def communicator(self, rank):
        raw = ctypes.c_void_p()
        _ep_capi.check(_ep_capi.load().moekit_ep_comm_create_local(self.raw, int(rank), ctypes.byref(raw)))
        return Communicator(raw, torch.device("cpu"), owner=self)


_INPUTS = ("x", "w_router", "router_bias", "w1", "b1", "w2", "b2")
_WEIGHTS = ("w_router", "w1", "b1", "w2", "b2")


def _views(args, tensors, names):
    for name in names:
        setattr(args, name, _runtime.view(tensors[name]))


def _forward(comm, plan, top_k, tensors):
    x = tensors["x"]
    tokens = x.shape[0]
    out = torch.empty_like(x)
    score_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32  # the library's, by the layer's dtype
    routing = EPRouting(x.new_empty((tokens, top_k), dtype=score_dtype),
                        x.new_empty((tokens, top_k), dtype=torch.int32),
                        x.new_empty((tensors["w_router"].shape[0],), dtype=torch.int32),
                        x.new_zeros((1,), dtype=torch.int32))
    saved = _runtime.buffer(plan.saved_bytes, x.device)
    workspace = _runtime.buffer(plan.workspace_bytes, x.device)
    args = _ep_capi.initialised(_ep_capi.EpFwdArgs, "moekit_ep_fwd_args_init")
    _views(args, tensors, _INPUTS)
    args.out = _runtime.view(out)
    _views(args, routing._asdict(), EPRouting._fields)
    comm.run("moekit_ep_forward", plan, args, saved, workspace)
    return out, saved, routing


class _EPLayer(torch.autograd.Function):
    @staticmethod
    def forward(ctx, comm, plan, top_k, grad_dtype, owners, *inputs):
        tensors = dict(zip(_INPUTS, inputs))
        out, saved, routing = _forward(comm, plan, top_k, tensors)
        # owners: {weight name: the tensor whose main_grad takes its gradient} (fused accumulation), else empty.
        ctx.comm, ctx.plan, ctx.grad_dtype, ctx.owners = comm, plan, grad_dtype, owners
        ctx.save_for_backward(saved, *inputs)
        ctx.mark_non_differentiable(*routing)
        return (out, *routing)

    @staticmethod
    def backward(ctx, dout, *_):
        saved, *inputs = ctx.saved_tensors
        tensors = dict(zip(_INPUTS, inputs))
        needs = dict(zip(_INPUTS, ctx.needs_input_grad[5:]))
        x = tensors["x"]
        args = _ep_capi.initialised(_ep_capi.EpBwdArgs, "moekit_ep_bwd_args_init")
        _views(args, tensors, ("x", "w_router", "w1", "w2", "b2"))
        dout = functional._dense(dout)  # held: the view borrows its memory
        args.dout = _runtime.view(dout)
        dx = torch.empty_like(x)
        args.dx = _runtime.view(dx)
        grads = {}
        for name in _WEIGHTS:
            weight = tensors[name]
            if weight is None:
                continue
            if name in ctx.owners and needs[name]:
                grads[name] = ctx.owners[name].main_grad
                setattr(args, "beta_d" + name, 1.0)
            else:
                grads[name] = torch.empty_like(weight, dtype=ctx.grad_dtype or weight.dtype)
            setattr(args, "d" + name, _runtime.view(grads[name]))
        workspace = _runtime.buffer(ctx.plan.workspace_bytes, x.device)
        ctx.comm.run("moekit_ep_backward", ctx.plan, args, saved, workspace)
        result = {"x": dx}
        for name in grads:
            result[name] = functional._fused_grad(ctx.owners[name]) if name in ctx.owners else grads[name]
        return (None,) * 5 + tuple(result.get(name) if needs[name] else None for name in _INPUTS)


def moe(x, w_router, w1, w2, top_k, comm, *, max_tokens, mode="exact", capacity=0, b1=None, b2=None,
        router="softmax_topk", renormalize=False, router_scale=1.0, router_bias=None, activation="swiglu",
        glu_layout="concat", glu_limit=7.0, fuse_wgrad_accumulation=False, return_routing=False):
    """The expert-parallel MoE layer on this rank of `comm`: x [T, H] this rank's tokens (T in 0..max_tokens, may
    differ between ranks), w_router [R*E, H] the whole router (equal on every rank), w1 [E, 2I, H] ([E, I, H]
    non-gated), w2 [E, H, I] and the optional b1 [E, 2I], b2 [E, H] this rank's experts -> out [T, H]; with
    return_routing, (out, EPRouting). Collective (see the module's docstring); max_tokens, like every option, must
    be the same on every rank.

    mode "exact": the per-expert counts are exchanged and read on the host (one synchronisation per forward and
    per backward), every all-to-allv moves exactly the rows routed and no pair is dropped. mode "capacity": each
    rank sends at most `capacity` (>= 1) rows to each rank, in fixed slots, with no host synchronisation; the rows
    bound for one rank are ordered by expert, then token, and those past the first `capacity` are dropped (they add
    nothing to out or to any gradient; EPRouting.dropped counts them). The other options are moekit.moe's;
    fuse_wgrad_accumulation adds the weight gradients into main_grad, as there.

    Gradients: x's, and this rank's experts' from every rank's tokens. w_router's is this rank's tokens' share:
    sum it over the ranks, as for any data-parallel weight."""
    options = dict(top_k=top_k, router=functional._choice("router", router, functional.ROUTERS),
                   renormalize=int(bool(renormalize)),
                   activation=functional._choice("activation", activation, functional.ACTIVATIONS),
                   glu_layout=functional._choice("glu_layout", glu_layout, functional.GLU_LAYOUTS))
    mode = functional._choice("mode", mode, MODES)
    tensors = dict(x=x, w_router=w_router, router_bias=router_bias, w1=w1, b1=b1, w2=w2, b2=b2)
    training = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors.values())
    fused = fuse_wgrad_accumulation and training
    weight_grad_dtype = functional._main_grad_dtype(functional.MOE, tensors) if fused else 0
    owners = {name: tensors[name] for name in _WEIGHTS
              if fused and tensors[name] is not None and tensors[name].requires_grad}
    tensors = {name: t.contiguous() if t is not None else None for name, t in tensors.items()}
    fields = {name: int(value) for name, value in functional._moe_fields(tensors, options).items()}
    fields.update({name: int(value) for name, value in options.items()})
    fields.update(router_scale=float(router_scale), glu_limit=float(glu_limit), max_tokens=int(max_tokens),
                  dtype=_runtime.moekit_dtype(x.dtype),
                  weight_grad_dtype=weight_grad_dtype)
    plan = comm.plan(fields, mode, int(capacity))
    inputs = [tensors[name] for name in _INPUTS]
    if training:
        out, *routing = _EPLayer.apply(comm, plan, int(top_k), _runtime.torch_dtype(weight_grad_dtype), owners,
                                       *inputs)
        routing = EPRouting(*routing)
    else:
        out, _, routing = _forward(comm, plan, int(top_k), tensors)
    return (out, routing) if return_routing else out


class EPMoELayer(MoELayer):
    """MoELayer over a Communicator: the router's `experts * comm.ranks` experts spread over the ranks, this one
    holding experts comm.rank * experts .. (comm.rank + 1) * experts - 1 (its w1, w2, b1, b2), and the whole router
    w_router, which must start equal on every rank (one seed, or a broadcast) and whose gradient the ranks sum.
    max_tokens bounds this rank's tokens per call, the same on every rank; mode and capacity as moekit.ep.moe.
    forward(x, return_routing=False): out with x's shape, and the EPRouting over the flattened tokens. The other
    options are MoELayer's but for load_balance_coeff, z_loss_coeff and backward_overwrites_saved, which the
    expert-parallel layer does not have."""

    def __init__(self, hidden, intermediate, experts, top_k, comm, max_tokens, device=None, dtype=None, *,
                 mode="exact", capacity=0, router="softmax_topk", renormalize=False, router_scale=1.0,
                 router_bias=False, activation="swiglu", glu_layout="concat", glu_limit=7.0, bias=False,
                 fuse_wgrad_accumulation=False):
        super().__init__(hidden, intermediate, experts, top_k, device, dtype, router=router, renormalize=renormalize,
                         router_scale=router_scale, router_bias=router_bias, activation=activation,
                         glu_layout=glu_layout, glu_limit=glu_limit, bias=bias,
                         router_experts=experts * comm.ranks, expert_begin=experts * comm.rank,
                         fuse_wgrad_accumulation=fuse_wgrad_accumulation)
        functional._choice("mode", mode, MODES)
        self.comm, self.max_tokens, self.mode, self.capacity = comm, max_tokens, mode, capacity

    def forward(self, x, return_routing=False):
        tokens = x.reshape(-1, x.shape[-1])
        result = moe(tokens, self.w_router, self.w1, self.w2, self.top_k, self.comm, max_tokens=self.max_tokens,
                     mode=self.mode, capacity=self.capacity, b1=self.b1, b2=self.b2, router=self.router,
                     renormalize=self.renormalize, router_scale=self.router_scale, router_bias=self.router_bias,
                     activation=self.activation, glu_layout=self.glu_layout, glu_limit=self.glu_limit,
                     fuse_wgrad_accumulation=self.fuse_wgrad_accumulation, return_routing=return_routing)
        if return_routing:
            return result[0].reshape(x.shape), result[1]
        return result.reshape(x.shape)

    def extra_repr(self):
        text = "%s, rank=%d, ranks=%d, max_tokens=%d, mode=%s" % (
            super().extra_repr(), self.comm.rank, self.comm.ranks, self.max_tokens, self.mode)
        return text + (", capacity=%d" % self.capacity if self.mode == "capacity" else "")
