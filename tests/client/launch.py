"""torchrun's contract for a script, at the cost of one import: `launch.py N SCRIPT.py` runs the
script on N ranks forked from this process, which has imported torch and transformers once (N
fresh interpreters would import them N times), each rank with RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set as torchrun sets them, so that
init_device_mesh() and from_pretrained(distributed_config=...) start their process groups as
under torchrun. The docs test runs docs/cli.md's snippets with it. Exits 1 when a rank fails
or runs longer than --timeout seconds (default 240).
"""
import os, signal, socket, sys, traceback

# One thread per rank, before torch starts (torch.set_num_threads here would leave the forked
# ranks an invalid thread pool).
os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
import torch  # noqa: E402
import torch.distributed  # noqa: E402,F401  (imported once, shared by the ranks)
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM  # noqa: E402


def warm_up():
    """Saves and loads a tiny model once, so that transformers' lazy imports (the loading path,
    the attention functions) happen here and the forked ranks inherit them."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        cfg = LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                          num_key_value_heads=2, vocab_size=32)
        LlamaForCausalLM(cfg).save_pretrained(d)
        with torch.no_grad():
            AutoModelForCausalLM.from_pretrained(d)(torch.zeros(1, 2, dtype=torch.long))


def main():
    args = sys.argv[1:]
    timeout = 240
    if args[:1] == ["--timeout"]:
        timeout, args = int(args[1]), args[2:]
    n, script = int(args[0]), args[1]
    transformers.logging.set_verbosity_error()
    warm_up()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pids = []
    for r in range(n):
        pid = os.fork()
        if pid == 0:
            signal.alarm(timeout)  # a hung rank dies instead of holding the test
            os.environ.update(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(n), LOCAL_WORLD_SIZE=str(n),
                              MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            sys.argv = [script, *args[2:]]
            code = 0
            try:
                import runpy
                runpy.run_path(script, run_name="__main__")
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except BaseException:  # noqa: BLE001 (the rank's failure is the result)
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        pids.append(pid)
    failed = []
    for r, pid in enumerate(pids):
        status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        if status != 0:
            failed.append(f"rank {r} exited {status}" + (" (timeout)" if status == -signal.SIGALRM else ""))
    if failed:
        print(f"launch.py: {script}: " + ", ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
