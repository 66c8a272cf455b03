"""The claim table: every checkable claim in the five seed notes (``/work/shared/seeds``), with the
verdict of the audit (``shared/reference/seed-claims.md``) it was first checked in.

Verdicts: T true on torch 2.13; C true with caveats, or the note's example is wrong in a way that
matters; F false; n/a not checkable by code. "(GPU)" marks claims whose measurement needs CUDA.
The labs re-measure every row; ``vla lab list --claims`` maps each row to its checks, or to the
reason it has none (``NO_LAB``).
"""

from __future__ import annotations

from dataclasses import dataclass

SEED_FILES = {
    "000": "000_5a492a584d89303b.txt",
    "001": "001_683e4051ca0a85ea.txt",
    "002": "002_7c580d975e8bd518.txt",
    "003": "003_561b8254ee2548a8.txt",
    "004": "004_86e0bdc7ce313ec8.txt",
}


@dataclass(frozen=True)
class Claim:
    id: str  # "S<seed>-<n>"
    seed: str  # "000".."004"
    verdict: str  # the audit's verdict (T / C / F / n/a, with a qualifier)
    gloss: str  # English gloss of the claim
    quote: str  # the claim as the note words it (Chinese, shortened with "…")

    @property
    def seed_file(self) -> str:
        return SEED_FILES[self.seed]


# Claims no lab checks, and why.
NO_LAB = {
    "S0-29": "needs an NVIDIA GPU and DALI installed; a statement about another library",
    "S3-09": "about open-pi-zero's TensorFlow input pipeline; vlastack reads RLDS without TensorFlow "
    "(tests/data/test_rlds.py), which removes the cause",
    "S4-08": "a statement about what openpi/open-pi-zero do, not a PyTorch behaviour",
    "S4-24": "needs torchrun with two ranks; covered by tests/train/test_cli.py::test_vla_train_under_torchrun_ddp",
}

# id | seed | verdict | English gloss | quote
_ROWS = """
S0-01|000|T|view() is zero-copy: it only changes metadata (strides), never moves data|`view()`: 零拷贝…只修改 Tensor 的元数据（Stride），不移动内存中的数据
S0-02|000|C|view() raises if the memory is not contiguous|如果内存不连续，它会报错
S0-03|000|C|reshape() views when it can, otherwise copies (clone)|`reshape()`…能 view 就 view，不能 view 就拷贝数据（clone）
S0-04|000|C|prefer view() to avoid reshape's hidden copy cost|应尽量用 `view` 以避免隐式拷贝带来的性能损耗
S0-05|000|T|a transpose is non-contiguous; view(-1) on it raises; contiguous().view(-1) works|`b = a.transpose(0, 1)`… `is_contiguous()` False; `b.view(-1)` 报错; `b.contiguous().view(-1)`
S0-06|000|T (GPU)|pin_memory locks host pages so the OS cannot swap them out|`pin_memory=True`: 在 CPU 内存中锁定一块区域，不让系统把它交换（Swap）到硬盘
S0-07|000|C (GPU)|pinned memory lets the GPU pull data by DMA, bypassing the CPU|允许 GPU 通过 DMA 快速拉取数据，**绕过 CPU**
S0-08|000|C (GPU)|non_blocking=True makes .to('cuda') not block the CPU thread|`non_blocking=True`: 让 `to('cuda')` 操作不阻塞 CPU 线程
S0-09|000|C (GPU)|while data transfers, the CPU prepares the next batch (pipelining)|在数据传输的同时，CPU 可以去准备下一个 batch（流水线并行）
S0-10|000|T|PyTorch is define-by-run: the graph is built while the code runs|PyTorch 是动态图 (Define-by-Run)…图是在代码运行过程中实时构建的
S0-11|000|T|grad_fn records how a tensor was made|`grad_fn`: 记录'我是怎么来的'
S0-12|000|T|no_grad stops graph building and saves no activations|`torch.no_grad()`: 停止构建计算图。不存中间激活值
S0-13|000|T|detach() makes a leaf with no history|`tensor.detach()`…变成了叶子节点，不再有历史记录
S0-14|000|C|a KV cache must be detached or memory explodes instantly|KV-Cache…必须 detach，否则显存瞬间爆炸
S0-15|000|C|zero_grad(set_to_none=True) is faster than zeroing and frees gradient memory|`zero_grad(set_to_none=True)`…比把梯度设为 0 更快，且直接释放梯度显存
S0-16|000|T|buffers follow model.cuda() and are saved in state_dict; plain attributes are not|Buffer…`model.cuda()` 时会自动跟着去 GPU；保存 `state_dict` 时会被保存。普通成员变量不会
S0-17|000|T|forward/full-backward hooks monitor activations and gradients (find vanishing/exploding grads)|`register_forward_hook(module, input, output)`…`register_full_backward_hook(module, grad_input, grad_output)`: 监控梯度（比如查哪里发生了梯度消失/爆炸）
S0-18|000|T (GPU ≥ 2)|DataParallel: one process, threads; the main GPU is overloaded, slow, unbalanced memory|DP: 单进程，多线程。主卡负载极重…慢，显存不均衡
S0-19|000|T|DDP: one process per GPU, identical model replicas|DDP: 多进程。每张卡一个独立的进程，模型副本完全一致
S0-20|000|C|ring all-reduce passes data hand to hand, no gathering on a main GPU|Ring-AllReduce…卡与卡之间手拉手传输，不需要汇总到主卡
S0-21|000|C (doc)|NCCL is optimised specifically for DDP communication|NCCL…专门优化 DDP 的通信
S0-22|000|C|fp16's range is narrow (6e-5 to 6e4)|FP16 的范围很窄（6×10⁻⁵ ~ 6×10⁴）
S0-23|000|C|gradients are often below 1e-5 and underflow to 0 in fp16|梯度经常小于 10⁻⁵，导致变成 0（Underflow）
S0-24|000|T|loss scaling: multiply by 65536, unscale, skip the step on inf/nan and lower the scale|Loss * 65536 (放大)…梯度 / 65536…如果有梯度变成了 inf/nan，跳过这次更新，减小放大倍数
S0-25|000|T|tracing cannot handle if/else: it records only the branch taken|Tracing…无法处理 if-else 逻辑（只会记录当时走的那条路）
S0-26|000|T|scripting supports control flow|Scripting…支持控制流
S0-27|000|T|C++ (ROS2) loads TorchScript with torch::jit::load, no Python needed|C++ (ROS2)…`torch::jit::load`…不依赖 Python
S0-28|000|C|data-loading bottleneck? check DataLoader num_workers|数据加载瓶颈？检查 DataLoader 的 num_workers
S0-29|000|n/a|consider NVIDIA DALI (decode images on the GPU)|考虑 NVIDIA DALI (用 GPU 解码图片)
S0-30|000|C|memory fragmentation? look for cat/stack in loops, which allocate new memory|显存碎片？检查是否在循环中用了 cat 或 stack 这种产生新内存的操作
S0-31|000|F|forgetting optimizer.zero_grad() is a cause of memory growth|"是否忘记 `optimizer.zero_grad()`？" (listed as a memory cause)
S0-32|000|T|forgetting torch.no_grad() where no gradients are needed wastes memory|是否在不需要梯度的地方忘记 `with torch.no_grad()`？
S0-33|000|T|too many tiny kernels: torch.compile fuses them|太多的 Tiny Kernels…用 `torch.compile`…Kernel Fusion
S1-01|001|T|c = a*b + b: dc/da = b, dc/db = a + 1|`c = a * b + b`…∂c/∂a = b, ∂c/∂b = a+1
S1-02|001|C|use torch.cuda.amp.GradScaler() and torch.cuda.amp.autocast()|`scaler = torch.cuda.amp.GradScaler()`…`with torch.cuda.amp.autocast():`
S1-03|001|C|load weights with model.load_state_dict(torch.load('m.pt', map_location='cuda'))|`model.load_state_dict(torch.load('m.pt', map_location='cuda'))`
S1-04|001|C|use num_workers = cores - 1 and turn on pin_memory|使用 num_workers≈CPU 核 - 1；开启 pin_memory
S1-05|001|T (GPU)|cut CPU->GPU transfers: preload, concatenate, copy one big batch|减少 CPU -> GPU 传输：预加载/拼接后一次传输大 batch
S1-06|001|T|gradient accumulation when memory is short|梯度累积：显存不足时 accumulate_steps
S1-07|001|T|gradient clipping with clip_grad_norm_|梯度裁剪：`torch.nn.utils.clip_grad_norm_`
S1-08|001|C|fix the seed with torch.manual_seed for reproducibility|seed 固定：提高可复现性 `torch.manual_seed`
S1-09|001|T|FSDP/ZeRO shard parameters, optimizer state and gradients to save memory|FSDP / ZeRO：大模型拆分参数/优化器/梯度节省显存
S1-10|001|C|mixed precision cuts memory and raises throughput (watch overflow)|混合精度：减少显存与提高吞吐（需关注溢出）
S1-11|001|T|gradient anomalies: NaN -> GradScaler / clipping / loss-scale adjustment|检查梯度异常：NaN -> GradScaler / 梯度裁剪 / loss scale 调整
S1-12|001|C|DataLoader deadlock: Windows needs the if __name__ == '__main__' guard|DataLoader 死锁：Windows 下需 `if __name__ == '__main__'`
S1-13|001|T (GPU)|low GPU utilisation: data loading or syncs (print syncs)|GPU 利用率低：瓶颈在数据加载或同步（print 触发 sync）
S1-14|001|F (remedy)|grad is None: parameter unused / branch not taken -> needs retain_graph|梯度为 None：未参与计算 / 条件分支未走 -> 需显式 `retain_graph` 场景
S1-15|001|T|memory leak: graphs kept alive, intermediate tensors stored in a list in a loop|内存泄露：保留计算图未释放；循环中存储中间 Tensor 在列表
S1-16|001|T|turn on anomaly detection to locate gradient errors|开启 anomaly detection 定位梯度错误
S1-17|001|C|dynamic graphs leave little room for compiler optimisation; 2.x compile mitigates it|动态图…极端场景下编译优化空间较小（2.x 通过 compile 缓解）
S2-01|002|C|a tensor stores just three pieces of metadata: storage reference, shape, stride|Tensor 本身只存储三个元数据——storage 引用、shape、stride
S2-02|002|C|t.storage() prints [torch.LongStorage of size 6]|`t.storage()` → `[torch.LongStorage of size 6]`
S2-03|002|T|t[1, 2] sits at 0 + 1*3 + 2*1 = 5 -> storage[5] = 6|t[1, 2] 的存储位置 = 0 + 1*3 + 2*1 = 5 → storage[5] = 6
S2-04|002|T|a transpose has stride (1, 3) and the same storage|转置…stride (1, 3)…storage id same: True
S2-05|002|T|a transposed tensor is not contiguous|转置后的张量不连续
S2-06|002|C|contiguous() returns a new tensor; clone() is fully independent|`contiguous()`: 返回一个新的 Tensor…`clone()`: …两者完全独立
S2-07|002|T|the contiguous copy of t.T has storage 1 4 2 5 3 6|t_c storage: 1 4 2 5 3 6
S2-08|002|C (benchmark flawed)|storage-order access is faster (CPU cache), shown with x[i, j].item() loops over 4096x4096|"按存储顺序访问速度更快,因为 CPU 缓存利用率更高" + the 4096² `x[i, j].item()` loops
S2-09|002|C|always loop in the order of the contiguous dimension|始终按连续维度的顺序循环
S2-10|002|T|autograd records history as a DAG|Autograd 通过构建有向无环图 (DAG) 来跟踪运算历史
S2-11|002|T|each backward() accumulates into .grad: x.grad 2 -> 4, w.grad 1 -> 2|每次调用 backward()，梯度会累加到 .grad…x.grad=[2.]→[4.], w.grad=[1.]→[2.]
S2-12|002|T|a micro autograd engine (Scalar) gives w.grad=0.5, x.grad=2.0, b.grad=1 for f = w*x + b|微型 Autograd 引擎(Scalar 类)…f = w*x + b…w.grad=0.5, x.grad=2.0, b.grad=1.
S2-13|002|T|no_grad for inference / requires_grad_(False) to freeze / detach(): z.requires_grad is False|`no_grad()` 推理时使用 / `requires_grad_(False)` 冻结参数 / `detach()`…`z.requires_grad` False
S2-14|002|C|register_module(name, module) registers submodules (called automatically by __setattr__)|`register_module(name, module)`: 将子模块注册(通过 `__setattr__` 自动调用)
S2-15|002|T|parameters(), state_dict(), to(device) rely on registration; a plain tensor attribute is not collected|`parameters()`, `state_dict()`, `to(device)` 都依赖注册机制…`self.W = torch.randn(…)` 普通 Tensor 不会被收集
S2-16|002|C|x @ W.T + b with randn weights: nn.Linear is implemented the same way|`x @ self.weight.T + self.bias`…nn.Linear 内部实现与此类似
S2-17|002|T|Sequential / ModuleList / ModuleDict register submodules (a plain list does not)|Sequential / ModuleList / ModuleDict table
S2-18|002|C|"forward hook runs before forward ... backward hook runs after forward"|前向钩子: 在 forward 执行前调用…后向钩子: 在 forward 执行后调用
S2-19|002|C|every dataset must implement __len__ and __getitem__|所有数据集必须实现两个方法 (`__len__`, `__getitem__`)
S2-20|002|T|Dataset -> Sampler -> BatchSampler -> collate_fn|Dataset → Sampler → BatchSampler → collate_fn
S2-21|002|C|WeightedRandomSampler([1, 10, 1]) oversamples class 1|`WeightedRandomSampler(torch.tensor([1.0, 10.0, 1.0]), …)` 类别 1 被过度采样
S2-22|002|C|a custom collate_fn is needed when samples are not simple (data, label) pairs|custom `collate_fn` "当样本结构不是简单的 (data, label) 时" for (img, label, path)
S2-23|002|C|torch.compile compiles PyTorch code to efficient GPU kernels (Triton/CUDA)|`torch.compile`…将 PyTorch 代码动态编译为高效的 GPU 内核…Triton / CUDA 内核
S2-24|002|T (GPU)|mode='reduce-overhead' cuts launch overhead for small batches|`reduce-overhead`: 减少小 batch 的启动开销
S2-25|002|C (partly F)|torch.compile usually gives ~20% end to end and 2-5x on some compute-heavy ops|"torch.compile 通常能带来 ~20% 的端到端加速, 在某些计算密集操作上可达 2-5 倍" (summary: "一行代码 ~20% 加速")
S2-26|002|T|the first call is slow because it compiles|第一次调用较慢,因为需要编译预热
S2-27|002|C|compile is not for one-off small computations or highly dynamic control flow|不适用: 一次性小计算…极度动态的控制流
S2-28|002|F|print(model._torchdynamo_compiled) tells whether a model is compiled|`print(model._torchdynamo_compiled)`
S2-29|002|F (default)|if compilation fails it falls back to eager automatically|如果编译失败,自动回退到 eager 模式
S2-30|002|T|TORCH_COMPILE_DEBUG=1 python train.py shows what the compiler did|`TORCH_COMPILE_DEBUG=1 python train.py`
S2-31|002|T|transposes and slices do not copy data|转置/切片不复制数据
S3-01|003|C|iterable-style datasets have no random access (samplers do not work there)|Iterable-style…不支持随机访问（`Sampler` 在此模式下失效）
S3-02|003|T|each worker gets a copy of an IterableDataset, which duplicates data|对于 IterableDataset…每个 Worker 都会得到一份 Dataset 的副本…会导致数据重复
S3-03|003|C|a worker takes indices from index_queue, calls dataset[index], collates, puts the batch on result_queue|Worker…不断从 index_queue 获取索引，调用 `dataset[index]`…通过 collate_fn 打包…放入 result_queue
S3-04|003|T|tensors go through shared memory, avoiding (de)serialisation between processes|Tensor 数据直接放入共享内存，减少了进程间序列化/反序列化的开销
S3-05|003|C|this is why PyTorch is faster than plain Python multiprocessing|这是 PyTorch 比 Python 原生 Multiprocessing 快的原因
S3-06|003|C|pin_memory=True makes the DataLoader allocate page-locked host memory|`pin_memory=True`…DataLoader 会在主机内存中分配一块锁页内存
S3-07|003|C (GPU)|DMA copies straight from pinned memory to GPU memory, very fast|通过 DMA 直接将数据从锁页内存拷贝到 GPU 显存…速度极快
S3-08|003|T|num_workers=0 loads data in the main process|`num_workers=0`: 在主进程中进行数据加载
S3-09|003|n/a|open-pi-zero: TF already parallelises; another PyTorch process layer causes contention or deadlock|open-pi-zero: TF 已有并行, "PyTorch 再套一层多进程，会导致资源竞争甚至死锁"
S3-10|003|C (doc)|the Python tensor wrapper holds the metadata (shape, stride, dtype, device)|`PyTensor` (Python wrapper): 包含元数据（Shape, Stride, DataType, Device）
S3-11|003|C|views make reshape almost free|View 机制…这使得 reshape 操作几乎零开销
S3-12|003|T|backward() sorts the graph topologically, applies the chain rule, accumulates grads in the leaves|`backward()`: 拓扑排序…链式法则…梯度会被累加到叶子节点
S3-13|003|T|more workers are not always better: start-up, memory, CPU contention|num_workers 是越多越好吗？不是…启动…内存…CPU 争抢
S3-14|003|C|set num_workers to the core count or half of it|通常设为 CPU 核心数或其一半
S3-15|003|T (GPU)|pinned memory is fixed host memory and can push the OS into swap|pin_memory 会占用固定的主机内存…迫使操作系统使用 Swap
S3-16|003|T (env)|Docker's small /dev/shm can crash multi-process DataLoaders|Docker…Shared Memory (`/dev/shm`) 限制太小，多进程 DataLoader 可能会崩溃
S3-17|003|C|the RNG state is copied, so all workers start from the same random state|随机数种子…被完整复制，所有 Worker 就会以相同的初始状态开始读取
S3-18|003|C|you must write a worker_init_fn that shards by worker_id|必须实现 `worker_init_fn`，根据 `worker_id`…分片（Sharding）
S3-19|003|T|state_dict holds only parameters and buffers, not the model code|`state_dict`…只包含参数和缓冲区…不包含模型结构代码
S3-20|003|C|DistributedSampler gives each rank its share of the indices|Sampler: "`DistributedSampler`" gives each rank its indices
S4-01|004|T|vision features (1152) are projected to the LLM width (2048) with nn.Linear(vision_dim, llm_dim)|视觉特征的维度 (e.g. 1152)…LLM 的维度 (e.g. 2048)…`nn.Linear(vision_dim, llm_dim)`
S4-02|004|T|inputs_embeds = cat([projected_vision, text_embeddings], dim=1), with an attention mask|`inputs_embeds = torch.cat([projected_vision, text_embeddings], dim=1)`…Attention Mask
S4-03|004|T|discrete actions (RT-2): Linear(hidden, vocab) -> softmax, reusing the LLM's lm_head|离散流 (RT-2): `nn.Linear(hidden_dim, vocab_size)` -> Softmax。复用 LLM 的 lm_head
S4-04|004|C|continuous actions (Pi0): an ActionDecoder MLP -> [B, Horizon, Action_Dim]|连续流 (Pi0): `ActionDecoder` (MLP) -> [B, Horizon, Action_Dim]
S4-05|004|C|VLA models are huge (3B-70B); fp32 does not fit in GPU memory|VLA 模型巨大 (3B-70B)，FP32 显存装不下
S4-06|004|T|bf16 is more stable than fp16 because its exponent is as wide as fp32's|BF16 比 FP16 更稳定，因为它的指数位宽和 FP32 一样
S4-07|004|T|fp16 needs a loss scaler, bf16 usually does not|如果是用 FP16 需要 scaler，BF16 通常不需要
S4-08|004|n/a|Pi0 in practice: bfloat16 throughout|Pi0 实践: 全程使用 `bfloat16`
S4-09|004|T|DDP: copy the model to each GPU, split the data, synchronise gradients|DDP: 复制模型到每张卡，切分数据，同步梯度
S4-10|004|C|8-bit optimizers quantise the optimizer state to 8 bits and save 75% of memory|8-bit Optimizer…把优化器状态 (Momentum, Variance) 量化到 8-bit，节省 75% 显存
S4-11|004|T|LoRA: train only low-rank A and B beside q_proj and v_proj (a hand-written LoRALinear)|LoRA: 只训练 `q_proj` 和 `v_proj` 旁边的低秩矩阵 A 和 B…手写 `LoRALinear`
S4-12|004|T|Pi0 flow matching: loss = mean((v_pred - v_target) ** 2)|Pi0 (Flow Matching)…`loss = torch.mean((v_pred - v_target) ** 2)`
S4-13|004|C|F.cross_entropy(logits.view(-1, vocab_size), target_tokens.view(-1))|`F.cross_entropy(logits.view(-1, vocab_size), target_tokens.view(-1))`
S4-14|004|T|KV cache: keys and values of earlier tokens need not be recomputed|KV Cache…前面的 token 计算过的 K 和 V 没必要重算
S4-15|004|F (as written)|a KVCache as List[Tensor]: cache[i] = (k, v), then cache[i] = cat([cache[i], new_k], dim=1)|`KVCache` 类，是一个 `List[torch.Tensor]`…`cache[layer_idx] = torch.cat([cache[layer_idx], new_k], dim=1)`
S4-16|004|T|the VLM runs once (prefill); afterwards only the action expert runs, reading the cache|VLM 部分只跑一次 (Prefill)，后续只跑 Action Expert 并读取 Cache
S4-17|004|C|torch.compile emits Triton/CUDA kernels; graph fusion cuts memory traffic|`torch.compile`…编译成优化的 Triton/CUDA Kernel。图融合减少显存读写
S4-18|004|C|the Pi0 docs say compile cuts inference latency from 245 ms to 75 ms|Pi0 文档提到，这能将推理延迟从 245ms 降到 75ms
S4-19|004|T|rearrange(q, 'b s (h d) -> b h s d', h=num_heads)|`rearrange(q, 'b s (h d) -> b h s d', h=num_heads)`
S4-20|004|T|Hydra/OmegaConf-style hierarchical overrides: python run.py model.depth=12|Hydra/OmegaConf…支持层级覆盖 `python run.py model.depth=12`
S4-21|004|F|PyTorch cannot read TFRecord directly; use tfds to build the pipeline|PyTorch 无法直接读取 TFRecord…使用 `tfds` 构建数据流
S4-22|004|T|convert to torch.Tensor via dlpack or numpy|用 `dlpack` 或者 `numpy` 转换成 `torch.Tensor`
S4-23|004|C|torch.inference_mode() is faster than no_grad()|`with torch.inference_mode():` 比 `no_grad()` 更快
S4-24|004|T|a @main_rank_only decorator makes only the main process log or save|`@main_rank_only` 装饰器，确保只有主进程打印日志或保存权重
S4-25|004|C (GPU)|torch.cuda.max_memory_reserved() monitors the memory peak in real time|`torch.cuda.max_memory_reserved()`…实时监控显存峰值
"""


def _parse(text: str) -> dict[str, Claim]:
    claims = {}
    for line in text.strip().splitlines():
        cid, seed, verdict, gloss, quote = line.split("|")
        claims[cid] = Claim(cid, seed, verdict, gloss, quote)
    return claims


CLAIMS: dict[str, Claim] = _parse(_ROWS)
