"""The real client of `autoshard export`: PyTorch and transformers on Gloo ranks (CPU).

apply_dtensor_plan() is what docs/cli.md shows a user; the rest runs a case on N ranks and
compares with the unsharded model:
  * logits: max |sharded - unsharded| <= 1e-5 * max |unsharded| on every rank;
  * greedy generate(): the same tokens on every rank;
  * `autoshard shard --plan` rank files: every tensor byte-equal to the parameter's local
    shard (DTensor.to_local(), or the whole tensor where PyTorch keeps it whole);
  * with FSDP2 (a plan storing parameters ZeRO-3 on data-parallel axes): one training step, each
    data-parallel rank on its slice of the batch, every gradient equal to the unsharded model's.
Ranks are forked from a parent that has imported torch and transformers (one import, not N).
"""
import datetime, json, os, pathlib, shutil, tempfile, time, traceback

# One thread per rank, set before torch starts, never with torch.set_num_threads here: that
# creates torch's thread pool, which a forked rank inherits invalid ("Invalid thread pool!"
# when accelerate sets the threads again in the rank).
os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, PrepareModuleInputOutput,
                                               PrepareModuleOutput, RowwiseParallel, SequenceParallel,
                                               loss_parallel, parallelize_module)

STYLES = {c.__name__: c for c in (ColwiseParallel, RowwiseParallel, SequenceParallel, PrepareModuleInput,
                                  PrepareModuleOutput, PrepareModuleInputOutput)}
LAYOUTS = {"Shard": Shard, "Replicate": Replicate, "Partial": Partial}
RTOL = 1e-5


def apply_dtensor_plan(model, export, device="cpu"):
    """Applies `autoshard export --to dtensor` (a parsed file) to `model`, as docs/cli.md shows."""
    shape, names, tp = export["mesh_shape"], export["mesh_dim_names"], export["tp_axis"]
    root = init_device_mesh(device, shape, mesh_dim_names=names)
    meshes = {None: root[names[tp]]}
    for name, m in export["meshes"].items():  # the tp ranks as (units, replicas): key/value heads replicated
        split = shape[:tp] + [m["units"], m["replicas"]] + shape[tp + 1:]
        meshes[name] = init_device_mesh(device, split, mesh_dim_names=names[:tp] + [name, name + "_replicas"] + names[tp + 1:])[name]
    for name, p in export["plan"].items():
        style = STYLES[p["style"]](**{k: eval(v, LAYOUTS) if isinstance(v, str) else v for k, v in p["kwargs"].items()})
        parallelize_module(model, meshes[p.get("mesh")], {name: style})
    for name, source in export["tied"].items():  # a tied weight: each style made its own parameter; one for both
        owner, _, attr = name.rpartition(".")
        setattr(model.get_submodule(owner), attr, model.get_parameter(source))
    for name, attributes in export["attributes"].items():
        for k, v in attributes.items():
            setattr(model.get_submodule(name), k, v)
    if export.get("fsdp"):  # ZeRO-3: FSDP2 after the tensor-parallel styles
        f = export["fsdp"]
        dims = {id(param_of(model, n)): d for n, d in f["shard_dims"].items()}
        ignored = {param_of(model, n) for n in f["ignored_params"]}
        for u in f["units"]:  # innermost first, the model last
            mesh = fsdp_mesh(root, u)
            unit = fully_shard(model.get_submodule(module_of(model, u["module"])) if u["module"] else model, mesh=mesh,
                               reshard_after_forward=f["reshard_after_forward"],
                               shard_placement_fn=lambda p: Shard(dims[id(p)]) if id(p) in dims else None,
                               ignored_params=ignored)
            if f["gradient_divide_factor"] != mesh.size():  # sharded over tp too: the tp ranks' shares sum
                unit.set_gradient_divide_factor(float(f["gradient_divide_factor"]))
                unit.set_force_sum_reduction_for_comms(True)  # Gloo has no PREMUL_SUM
    return root


def flat_mesh(root, axes, name):
    """The 1-D mesh of `root`'s named axes (in mesh order), flattened under `name` when several."""
    return root[axes[0]] if len(axes) == 1 else root[tuple(axes)]._flatten(name)


def fsdp_mesh(root, u):
    """FSDP2's mesh on `root` (the export's mesh) for unit `u`: its shard axes flattened in mesh
    order, after HSDP's replicate axes flattened when there are any."""
    shard_name, rep_name = "_".join(u["shard_axes"]), "_".join(u["replicate_axes"])
    shard = flat_mesh(root, u["shard_axes"], shard_name)
    if not u["replicate_axes"]:
        return shard
    flat_mesh(root, u["replicate_axes"], rep_name)
    return root[rep_name, shard_name]


def param_name(model, name, params=None):
    """The model's name for a parameter a plan (a checkpoint, a rank file) names, or None:
    transformers renamed GPT-NeoX's embed_out lm_head in transformers 5, and GPT-2's checkpoints
    drop "transformer."."""
    params = params if params is not None else dict(model.named_parameters(remove_duplicate=False))
    prefix = getattr(model, "base_model_prefix", "") + "."
    for n in (name, name.replace("embed_out.", "lm_head.", 1), prefix + name):
        if n in params:
            return n
    return None


def param_of(model, name):
    """The model's parameter a plan names (param_name)."""
    params = dict(model.named_parameters(remove_duplicate=False))
    n = param_name(model, name, params)
    if n is None:
        raise KeyError(f"the model has no parameter {name!r}")
    return params[n]


def module_of(model, name):
    """The model's module name for a layer the plan names (GPT-2's checkpoints drop "transformer.")."""
    prefix = getattr(model, "base_model_prefix", "") + "."
    for n in (name, prefix + name):
        try:
            model.get_submodule(n)
            return n
        except AttributeError:
            pass
    raise KeyError(f"the model has no module {name!r}")


def rel_error(got, want):
    if isinstance(got, DTensor):
        got = got.full_tensor()
    if got.shape != want.shape:
        return float("inf")
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


def check_rank_files(model, shard_dir, rank, other_storage=()):
    """Every tensor of rank-<rank>.safetensors equals the parameter's local shard, byte for byte
    (but those FSDP2 stores in other blocks, which the export lists in other_storage: skipped)."""
    from safetensors.torch import load_file
    files = load_file(os.path.join(shard_dir, f"rank-{rank}.safetensors"))
    params = dict(model.named_parameters(remove_duplicate=False))
    bad, found = [], set()
    for name, t in files.items():
        n = param_name(model, name, params)
        if n is None:
            bad.append(f"{name}: in the rank file, not a parameter of the model")
            continue
        found.add(n)
        if name in other_storage:
            continue
        p = params[n]
        local = p.to_local() if isinstance(p, DTensor) else p.data
        if tuple(local.shape) != tuple(t.shape) or local.dtype != t.dtype or \
                local.contiguous().view(torch.uint8).numpy().tobytes() != t.contiguous().view(torch.uint8).numpy().tobytes():
            bad.append(f"{name}: rank file {tuple(t.shape)}, PyTorch's local shard {tuple(local.shape)}"
                       + ("" if tuple(local.shape) != tuple(t.shape) else " (other bytes)"))
    # Every parameter the model holds (a tied one once, under the name it has first).
    missing = [n for n, p in model.named_parameters() if n not in found]
    if missing:
        bad.append(f"parameters not in the rank file: {missing[:4]}")
    return bad


class Run:
    """One world of `world` forked ranks running `fn(rank, world, *args)`; results are what each
    rank's fn returns (a list of failure strings), or its exception."""

    def __init__(self, world, timeout=240):
        self.world, self.timeout = world, timeout

    def __call__(self, fn, *args):
        tmp = tempfile.mkdtemp(prefix="autoshard-client-")
        ctx = mp.get_context("fork")
        procs = [ctx.Process(target=_rank_entry, args=(fn, r, self.world, tmp, args)) for r in range(self.world)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + self.timeout
        for p in procs:
            p.join(max(1.0, deadline - time.monotonic()))
        results = []
        for r, p in enumerate(procs):
            if p.is_alive():
                p.kill()
                p.join()
                results.append([f"rank {r}: still running after {self.timeout} s (killed)"])
                continue
            f = pathlib.Path(tmp, f"result-{r}.json")
            results.append(json.loads(f.read_text()) if f.exists() else [f"rank {r}: exited {p.exitcode} with no result"])
        shutil.rmtree(tmp, ignore_errors=True)  # the store and the results: nothing is left in /tmp
        return results


def _rank_entry(fn, rank, world, tmp, args):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    out = []
    try:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=90))
        out = fn(rank, world, *args)
    except Exception:
        out = [f"rank {rank}: " + traceback.format_exc(limit=6)]
    pathlib.Path(tmp, f"result-{rank}.json").write_text(json.dumps(out))
    try:
        if not out:
            dist.destroy_process_group()
    finally:
        os._exit(0)
