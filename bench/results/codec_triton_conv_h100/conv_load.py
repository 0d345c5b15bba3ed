"""One engine load (0.6B, the node's max_takes 4 / warm_takes 4 when the tree has it) in this process: load s,
the codec capture note, and the first 40-frame 4-take request's wall."""
import inspect, json, sys, time
sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[1] + "/bench")
import torch
from gpu_bench import checkpoint
from engine import BatchItem, Engine, Request
ck = checkpoint("0.6b")
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
kw = {"max_takes": 4, "warm_takes": 4} if "warm_takes" in inspect.signature(Engine.load).parameters else {"max_takes": 4}
t = time.perf_counter(); eng = Engine.load(ck, device="cuda", dtype="bf16", cuda_graphs="on", triton="auto", **kw)
torch.cuda.synchronize(); load = time.perf_counter() - t
req = Request(mode="custom", text="A first request after the load.", language="English", speaker="ryan")
p = eng.defaults.replace(max_new_tokens=40, min_new_tokens=40)
walls = []
for _ in range(2):
    t = time.perf_counter(); eng.generate_batch([BatchItem(req, takes=4)], params=p); walls.append(time.perf_counter() - t)
print(json.dumps({"load_s": round(load, 3), "first_4take_40f_s": [round(w, 3) for w in walls],
                  "notes": [n for n in eng.info.notes if "codec" in n or "kernels on" in n]}))
