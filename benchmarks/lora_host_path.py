"""Where the by-token LoRA shrink's time goes on a CUDA device: do_bench of the public call, of the Triton
entry with split_k=1, and a cProfile of the host path."""
import cProfile, pstats, sys
sys.path[:0] = ["packages/ascend-kernels/src", "packages/ascend-core/src"]
import torch, triton.testing
from vllm_ascend.kernels import lora
from vllm_ascend.kernels._triton import lora as tl_lora
dev = torch.device("cuda")
H, R, S = 4096, 16, 4
a = torch.randn(S, 1, R, H, device=dev, dtype=torch.bfloat16)
for T in (1, 64, 1024):
    x = torch.randn(T, H, device=dev, dtype=torch.bfloat16)
    out = torch.zeros(T, R, device=dev, dtype=torch.float32)
    idx = torch.arange(T, device=dev, dtype=torch.int32) % S
    f_pub = lambda: lora.lora_shrink(x, a, out, idx, 0.5)
    f_k1 = lambda: tl_lora.lora_shrink_tokens(x, a[:, 0], out, idx, 0.5, split_k=1)
    f_kd = lambda: tl_lora.lora_shrink_tokens(x, a[:, 0], out, idx, 0.5)
    for name, f in (("public", f_pub), ("triton split_k=1", f_k1), ("triton default split", f_kd)):
        f(); torch.cuda.synchronize()
        print(f"T={T:5d} {name:22s} do_bench {triton.testing.do_bench(f, warmup=20, rep=100):.4f} ms")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        f_pub()
    print(f"T={T:5d} public in a CUDA graph  do_bench {triton.testing.do_bench(g.replay, warmup=20, rep=100):.4f} ms")
x = torch.randn(1, H, device=dev, dtype=torch.bfloat16); out = torch.zeros(1, R, device=dev); idx = torch.zeros(1, device=dev, dtype=torch.int32)
pr = cProfile.Profile(); pr.enable()
for _ in range(300): lora.lora_shrink(x, a, out, idx, 0.5)
pr.disable(); torch.cuda.synchronize()
pstats.Stats(pr).sort_stats("tottime").print_stats(18)
