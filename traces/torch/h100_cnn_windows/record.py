"""Record real CUDA training traces on one GPU: a single-process CNN, and a 2-rank DDP
(gloo, both ranks on cuda:0) MLP; torch.profiler CPU+CUDA, record_shapes, 2 windows."""
import gzip, json, os, shutil, sys, time
import torch, torch.distributed as dist, torch.multiprocessing as mp
from torch import nn
OUT = sys.argv[1]
def cnn():
    return nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(128, 10))
def record(model, step, name, rank=None):
    n = [0]
    def ready(p):
        path = os.path.join(OUT, f"{name}.w{n[0]}.json" if rank is None else f"{name}.rank{rank}.w{n[0]}.json")
        p.export_chrome_trace(path); n[0] += 1
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA],
                                schedule=torch.profiler.schedule(wait=2, warmup=2, active=3, repeat=2),
                                on_trace_ready=ready, record_shapes=True) as prof:
        for _ in range(16):
            step(); prof.step()
    torch.cuda.synchronize()
def single():
    m = cnn().cuda(); opt = torch.optim.SGD(m.parameters(), lr=0.01)
    x = torch.randn(64, 3, 64, 64, device="cuda"); y = torch.randint(0, 10, (64,), device="cuda")
    def step():
        opt.zero_grad(set_to_none=True); nn.functional.cross_entropy(m(x), y).backward(); opt.step()
    for _ in range(5): step()
    record(m, step, "cnn_1gpu")
def ddp(rank, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    torch.cuda.set_device(0)
    m = nn.Sequential(*[nn.Sequential(nn.Linear(1024, 1024), nn.ReLU()) for _ in range(12)]).cuda()
    d = nn.parallel.DistributedDataParallel(m, device_ids=[0], bucket_cap_mb=4)
    opt = torch.optim.SGD(d.parameters(), lr=0.01)
    x = torch.randn(256, 1024, device="cuda")
    def step():
        opt.zero_grad(set_to_none=True); d(x).pow(2).mean().backward(); opt.step()
    for _ in range(5): step()
    record(d, step, "mlp_ddp_gloo_cuda", rank)
    dist.destroy_process_group()
if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    print(torch.__version__, torch.cuda.get_device_name(0))
    t = time.time(); single(); print("single", time.time() - t)
    t = time.time(); mp.spawn(ddp, args=(29517,), nprocs=2, join=True); print("ddp", time.time() - t)
    for f in sorted(os.listdir(OUT)):
        print(f, os.path.getsize(os.path.join(OUT, f)))
