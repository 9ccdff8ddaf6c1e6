"""Chinese for the chapters' output: table captions and headers, figure text, verdicts (see pylib.i18n).

Terms follow book/part1/glossary.md (微批次, 气泡, 分片, 容量因子, 通信原语 ...); TP/SP/CP/EP/PP/DP, All-Reduce and the
other collectives' names, and code identifiers stay as they are."""

MESSAGES: dict[str, str] = {
    # -- pylib/viz/pp.py: pipeline figures
    "measured: schedule": "实测：调度",
    "measured: replay": "实测：回放",
    "s": "秒",
    "units": "单位时间",
    "rank {r}": "rank {r}",
    "time ({unit})": "时间（{unit}）",
    "time": "时间",
    "bubble {rel:.3f} of ideal ({share:.1%} of the step)": "气泡为理想时间的 {rel:.3f}（占一步的 {share:.1%}）",
    "forward": "前向",
    "backward": "反向",
    "{kind} chunk {c}": "{kind} 块 {c}",
    "bubble": "气泡",
    "send / recv wait": "send / recv 等待",
    "{name}: formula": "{name}：公式",
    "microbatches m": "微批次数 m",
    "bubble / ideal time": "气泡 / 理想时间",
    "Bubble vs microbatches": "气泡与微批次数",
    "blocks in forward order (embedding, layers, ln_f + LM head)": "按前向顺序排列的模块（embedding、各层、ln_f + LM head）",
    "{n} stage boundaries, each a P2P of [b, s, h] per microbatch": "{n} 个 stage 边界，每个微批次在每处做一次 [b, s, h] 的 P2P",
    # -- pylib/viz/pp_tables.py: the pipeline chapter's tables
    " + embedding": " + embedding",
    " + ln_f, LM head, loss": " + ln_f、LM head、loss",
    "chunk {c} = virtual stage {stage}: layers {layers}": "块 {c} = 虚拟 stage {stage}：层 {layers}",
    "; ": "；",
    "split": "切分",
    "rank": "rank",
    "what it holds": "持有的内容",
    "The reference model's {n_layers} layers dealt out by `stage_layers` / `rank_chunks`: a plain "
    "pipeline, and an interleaved one with v = 2 chunks per rank (chunk c of rank r is virtual stage c·p + r).":
    "参考模型的 {n_layers} 层由 `stage_layers` / `rank_chunks` 分配：普通流水线，以及每个 rank 持有 v = 2 个块的"
    "交错流水线（rank r 的块 c 是虚拟 stage c·p + r）。",
    "weight (seed B)": "权重（seed B）",
    "seed B says (PP column)": "seed B 的说法（PP 列）",
    "held by (from `shard_specs`, p = {p})": "持有者（来自 `shard_specs`，p = {p}）",
    "shape on that rank": "该 rank 上的形状",
    "Seed B's PP column, rebuilt from `shard_specs`: every weight is held whole ([out, in], as nn.Linear "
    "stores it) by exactly one rank.":
    "由 `shard_specs` 重建的 seed B 的 PP 列：每个权重都由恰好一个 rank 完整持有（[out, in]，与 nn.Linear 的存储方式一致）。",
    "sends (fwd: activation)": "send（前向：激活）",
    "recvs (fwd)": "recv（前向）",
    "sends (bwd: gradient)": "send（反向：梯度）",
    "recvs (bwd)": "recv（反向）",
    "bytes sent, traced": "发送字节数（追踪）",
    "formula": "公式",
    "The point-to-point ops of one 1F1B step, p = {p}, m = {m} microbatches of [b, s, h] = "
    "{shape} float64 ({message} B each), traced on real ranks, against `p2p_bytes_per_rank`. All ranks "
    "together: {total} B = 2·(p−1)·m·b·s·h·8.":
    "一个 1F1B 步骤中的点对点操作，p = {p}，m = {m} 个 [b, s, h] = {shape} 的 float64 微批次（每个 {message} B），"
    "在真实 rank 上追踪，并与 `p2p_bytes_per_rank` 对照。所有 rank 合计：{total} B = 2·(p−1)·m·b·s·h·8。",
    "schedule": "调度",
    "loss (rank {r})": "loss（rank {r}）",
    "|loss − reference|": "|loss − 参考值|",
    "gradients compared": "比较的梯度数",
    "max |grad − reference|": "最大 |grad − 参考值|",
    "One training step of each schedule on {p} gloo ranks, m = {m}, against the single-device model "
    "(reference loss {ref_loss:.12f}). Every parameter's gradient is compared, each held by exactly one rank.":
    "每种调度在 {p} 个 gloo rank 上训练一步，m = {m}，与单设备模型对照（参考 loss {ref_loss:.12f}）。"
    "每个参数的梯度都参与比较，每个参数都由恰好一个 rank 持有。",
    "formula (p−1)/(v·m)": "公式 (p−1)/(v·m)",
    "schedule (simulated)": "调度（模拟）",
    "replay of the real run": "真实运行的回放",
    "share of the step (formula)": "占一步的比例（公式）",
    "The bubble, idle time relative to compute time, mean over the {p} ranks: the formula, the "
    "simulated schedule and the replayed real run agree exactly.":
    "气泡，即空闲时间相对计算时间的比值，取 {p} 个 rank 的平均：公式、模拟的调度与真实运行的回放完全一致。",
    "in flight, measured": "在途数（实测）",
    "in stages' worth": "折合 stage 数",
    "bytes saved per microbatch (per chunk)": "每个微批次保存的字节数（每块）",
    "peak activation bytes, measured": "激活峰值字节数（实测）",
    "formula: in flight × bytes": "公式：在途数 × 字节数",
    "Peak microbatches in flight and peak activation memory per rank, p = {p}, m = {m}, measured on the "
    "real runs (bytes autograd saved for backward) against `peak_in_flight` and `activation_memory`.":
    "每个 rank 的在途微批次峰值与激活显存峰值，p = {p}，m = {m}，在真实运行上实测（autograd 为反向保存的字节数），"
    "并与 `peak_in_flight` 和 `activation_memory` 对照。",
    "‖grad‖ / ‖reference‖, loss not scaled": "‖grad‖ / ‖参考值‖，loss 未缩放",
    "the same, loss / m (the fix)": "同上，loss / m（修正）",
    "logged loss (both)": "记录的 loss（两者）",
    "1F1B on 4 ranks with and without dividing each microbatch's loss by m before its backward: "
    "unscaled, every gradient is exactly m times the reference; the logged loss cannot tell.":
    "4 个 rank 上的 1F1B，反向前是否将每个微批次的 loss 除以 m：不缩放时，每个梯度都恰好是参考值的 m 倍；"
    "记录的 loss 看不出区别。",
    "posted sends (simulated)": "异步 send（模拟）",
    "blocking sends (simulated)": "阻塞 send（模拟）",
    "Bubble with posted and with blocking sends, m = 8, from the simulator. Only the interleaved "
    "schedule, with a backward dearer than a forward, pays for blocking sends, and how much depends on p and "
    "the costs.":
    "异步 send 与阻塞 send 下的气泡，m = 8，来自模拟器。只有交错调度在反向比前向更贵时才为阻塞 send 付出代价，"
    "代价多少取决于 p 和各项开销。",
    # -- pylib/viz/tp.py: tensor-parallel figures
    "x [n, d_in]\nwhole on every rank": "x [n, d_in]\n每个 rank 上完整一份",
    "rank {r}: W_{r}, columns\n[d_in, d_out/t]": "rank {r}：W_{r}，按列\n[d_in, d_out/t]",
    "rank {r}: y_{r} = x W_{r}\n[n, d_out/t]": "rank {r}：y_{r} = x W_{r}\n[n, d_out/t]",
    "rank {r}: V_{r}, rows\n[d_out/t, d_in]": "rank {r}：V_{r}，按行\n[d_out/t, d_in]",
    "rank {r}: y_{r} V_{r}\npartial sum, full size": "rank {r}：y_{r} V_{r}\n部分和，完整尺寸",
    "column split:\nW cut by its\noutput columns": "列切分：\nW 按其\n输出列切开",
    "concat(y_r) = x W: no communication": "concat(y_r) = x W：无需通信",
    "row split: V cut by its input\nrows; rank r multiplies\nits own y_r by V_r": "行切分：V 按其输入\n行切开；rank r 用\n自己的 y_r 乘以 V_r",
    "all-reduce: sum\nof the partial sums": "All-Reduce：\n对部分和求和",
    "one device:\nconcat = x W {ok_y}\nsum = x W V {ok_z}": "单设备对照：\nconcat = x W {ok_y}\nsum = x W V {ok_z}",
    "TP on {t} ranks: a column split's results concatenate (rows 1-2);\n"
    "a row split's results are full-size partial sums, all-reduced (rows 3-4)":
    "{t} 个 rank 上的 TP：列切分的结果直接拼接（第 1–2 行）；\n行切分的结果是完整尺寸的部分和，需要 All-Reduce（第 3–4 行）",
    "1/t of heads": "1/t 的头",
    "1/t of h_ffn": "1/t 的 h_ffn",
    "1/t of columns": "1/t 的列",
    "{part}: {what}\nall {s} tokens": "{part}：{what}\n全部 {s} 个 token",
    "LN, residual\n{n} tokens": "LN、残差\n{n} 个 token",
    "identity": "恒等",
    "nothing sent": "不发送数据",
    " (regather)": "（重新 gather）",
    "weight grads\nfrom rebuilt input": "由重建的输入\n计算权重梯度",
    "sent {bytes}": "发送 {bytes}",
    "One layer, t = {t}, b = {b}, s = {s}, h = {h} ({dtype}): SP turns each\n"
    "all-reduce into an all-gather into the TP region and a reduce-scatter out of it":
    "一层，t = {t}，b = {b}，s = {s}，h = {h}（{dtype}）：SP 把每个 All-Reduce\n"
    "变成进入 TP 区域的 All-Gather 和离开它的 Reduce-Scatter",
    # -- pylib/viz/dp.py: data-parallel figures
    "held by one rank ({unit})": "单个 rank 持有（{unit}）",
    "parameters": "参数",
    "gradients": "梯度",
    "optimizer state": "优化器状态",
    "transient (peak)": "临时（峰值）",
    "Model state per rank, measured": "每个 rank 的模型状态（实测）",
    "time since backward began ({unit})": "自反向开始的时间（{unit}）",
    "Buckets during backward: {hidden:.0%} of communication hidden": "反向期间的桶：{hidden:.0%} 的通信被隐藏",
    "replicated": "复制",
    "dY": "dY",
    "d{weight} = Σ partials": "d{weight} = Σ 部分和",
    ", {n} padding": "，填充 {n}",
    ", no padding": "，无填充",
    "{key}: {n} parameters, {numel} elements{pad}, {parts} slices of {shard}": "{key}：{n} 个参数，{numel} 个元素{pad}，{parts} 个分片，每片 {shard}",
    "own shards ": "自己的分片 ",
    "gathers and frees, in the order they happened": "按发生顺序排列的 gather 与释放",
    "parameters resident ({unit})": "驻留的参数（{unit}）",
    "ZeRO-3: one unit gathered at a time, peak {top:,.1f} {unit}": "ZeRO-3：一次只 gather 一个单元，峰值 {top:,.1f} {unit}",
    # -- pylib/viz/cp.py: context-parallel figures
    "Causal attention work per rank, cp = {n}": "每个 rank 的因果注意力计算量，cp = {n}",
    "key position": "key 位置",
    "query position": "query 位置",
    "Who computes which scores (causal, s = {s}, cp = {cp})": "谁计算哪些分数（因果，s = {s}，cp = {cp}）",
    "{name} [s, h]: rows split over cp = {cp}": "{name} [s, h]：按行切分到 cp = {cp} 个 rank",
    "feature (h = {h}, first 8 shown)": "特征（h = {h}，只显示前 8 个）",
    "feature (h = {h})": "特征（h = {h}）",
    "token position (s)": "token 位置（s）",
    "scores q k^T [s, s]: row i computed by token i's rank": "分数 q k^T [s, s]：第 i 行由 token i 所在的 rank 计算",
    "key position (its K/V: solid = on the same rank, pale = from another rank)": "key 位置（其 K/V：实色 = 在同一 rank，浅色 = 来自其他 rank）",
    "cp (ring size = number of merged blocks)": "cp（环的大小 = 合并的块数）",
    "RMS error": "RMS 误差",
    # -- pylib/viz/ep.py: expert-parallel figures
    "top-{k} routing: token -> experts -> owning rank (EP={ep})": "top-{k} 路由：token -> 专家 -> 所在 rank（EP={ep}）",
    "to (destination)": "到（目的）",
    "from (source)": "从（源）",
    "{layout} layers: ": "{layout} 层：",
    "the same ranks, two groupings (same colour = same group)": "同一组 rank，两种分组（同色 = 同组）",
    "perfect balance ": "完全均衡 ",
    "training step": "训练步",
    "max / mean load": "最大 / 平均负载",
    "capacity factor": "容量因子",
    "dropped (%)": "丢弃（%）",
    "expert hidden unit (h_ffn)": "专家隐藏单元（h_ffn）",
    "who holds which expert weights": "谁持有哪些专家权重",
    # -- pylib/viz/compose.py, matrix_dims.py
    "position in the sequence": "序列中的位置",
    "sequence (row of the global batch)": "序列（全局 batch 的行）",
    "memory per rank": "每个 rank 的显存",
    "traffic per rank, by mesh axis": "每个 rank 的通信量，按 mesh 轴",
    "share of each dimension one rank holds, measured on 2 ranks per mode (SP: beyond TP's cuts)": "单个 rank 持有的各维度份额，每种模式在 2 个 rank 上实测（SP：在 TP 切分之外）",
    "FFN intermediate [b, s, h_ffn] = [{b}, {s}, {d_ff}]: the part rank {rank} holds\n(coordinates tp {tp}, cp {cp}, dp {dp})": "FFN 中间结果 [b, s, h_ffn] = [{b}, {s}, {d_ff}]：rank {rank} 持有的部分\n（坐标 tp {tp}，cp {cp}，dp {dp}）",
    "rank {r} holds 1/{n}": "rank {r} 持有 1/{n}",
    # -- book/part0/collectives.md
    "✓ all four collectives hold on every one of {n} ranks": "✓ 四个通信原语在全部 {n} 个 rank 上都成立",
    "collective": "通信原语",
    "sent per rank": "每个 rank 发送",
    "Bytes each rank sends (and receives), traced, for S = {psi:,} B.": "每个 rank 发送（与接收）的字节数，实测追踪，S = {psi:,} B。",
    "✓ {steps} steps on {n} ranks; after step {k} rank r holds the sum of chunk r (a reduce-scatter), after the last step all of them":
    "✓ {n} 个 rank 上共 {steps} 步；第 {k} 步之后 rank r 持有块 r 的和（即 Reduce-Scatter），最后一步之后持有全部块的和",
    "steps": "步数",
    "chunk (B)": "块（B）",
    "sent per rank (B)": "每个 rank 发送（B）",
    "sent / Ψ": "发送 / Ψ",
    "The ring all-reduce of Ψ = {psi:,} B from traced sends.": "Ψ = {psi:,} B 的环形 All-Reduce，来自追踪到的 send。",
    "Each op's traced forward and backward on {n} ranks.": "{n} 个 rank 上追踪到的每个算子的前向与反向。",
    "✓ every backward is the transpose of its forward, and traced as backward": "✓ 每个反向都是其前向的转置，并被追踪为反向",
    "✗ wrong g: <x, dx> / <y, dy> = {ratio:.3f}": "✗ 错误的 g：<x, dx> / <y, dy> = {ratio:.3f}",
    # -- book/part3/tp.md
    "parameter": "参数",
    "full [out, in]": "完整 [out, in]",
    "rank 0 holds": "rank 0 持有",
    "dim cut": "切分的维度",
    "share": "份额",
    "How rank 0 of a TP group of 2 holds the model (from `shard_specs()`; layer 1 is laid out as layer 0). Shapes in torch's [out, in] layout.": "大小为 2 的 TP 组中 rank 0 如何持有模型（来自 `shard_specs()`；第 1 层的布局与第 0 层相同）。形状采用 torch 的 [out, in] 布局。",
    "consequence": "后果",
    "The four kinds of split in `shard_specs()`, and what each means for the next operator.": "`shard_specs()` 中的四种切分，以及每种切分对下一个算子意味着什么。",
    "The heads held by the *last* rank of the TP group, 8 query heads, from `head_layout`. Split: the rank owns its K/V heads; copy ×k: k ranks hold the same K/V head.": "TP 组中*最后一个* rank 持有的头，8 个 query 头，来自 `head_layout`。split：该 rank 独占其 K/V 头；copy ×k：k 个 rank 持有同一个 K/V 头。",
    "parameter (layer 0)": "参数（第 0 层）",
    "max error before": "之前的最大误差",
    "after the reduction": "归约之后",
    "GQA with t = 4 > n_kv_head = 2: gradient errors against the reference (rank 0; gathered over the TP group), before and after `allreduce_replicated_kv_grads`. Only the copied K/V projections are wrong, and the reduction fixes them.": "t = 4 > n_kv_head = 2 的 GQA：相对参考值的梯度误差（rank 0；在 TP 组内 gather），`allreduce_replicated_kv_grads` 之前与之后。只有被复制的 K/V 投影出错，归约修正了它们。",
    "phase": "阶段",
    "where": "位置",
    "payload (B)": "载荷（B）",
    "count": "次数",
    "Every collective of one training step of the TP model (t = {t}, L = {cfg_n_layers}, b = {B}, s = {S}, h = {cfg_d_model}, float64), rank 0, as traced; layers' ops grouped by attn / mlp. Equal, op for op, to `model_collectives`.": "TP 模型一个训练步中的每个通信原语（t = {t}，L = {cfg_n_layers}，b = {B}，s = {S}，h = {cfg_d_model}，float64），rank 0，实测追踪；各层的操作按 attn / mlp 分组。逐个操作与 `model_collectives` 相等。",
    "payload S (B)": "载荷 S（B）",
    "sent": "发送",
    "One TP layer, forward and backward, rank 0 (b = {B}, s = {S}, h = {h}, float64: S = b·s·h·8 = {b_s_h_e} B): bytes sent, traced, and from `layer_collectives`, op for op.": "一个 TP 层的前向与反向，rank 0（b = {B}，s = {S}，h = {h}，float64：S = b·s·h·8 = {b_s_h_e} B）：发送的字节数，实测追踪值与 `layer_collectives` 逐个操作对照。",
    "measured (B)": "实测（B）",
    "ours (B)": "我们的公式（B）",
    "paper × e/2 (B)": "论文 × e/2（B）",
    "measured / paper": "实测 / 论文",
    "Activation bytes one layer keeps for backward, per rank (b = {B}, s = {S}, h = {cfg_d_model}, a = {cfg_n_heads}, h_ffn = 4h, float64): measured, our formula, and Korthikanti et al.'s scaled from 2-byte to 8-byte elements; the last column is the saving against t = 1.": "每个 rank 上一层为反向保存的激活字节数（b = {B}，s = {S}，h = {cfg_d_model}，a = {cfg_n_heads}，h_ffn = 4h，float64）：实测值、我们的公式，以及 Korthikanti 等人的公式（从 2 字节元素换算到 8 字节）；最后一列是相对 t = 1 的节省。",
    "saved tensor": "保存的张量",
    "relation": "关系",
    "why": "原因",
    "Korthikanti et al.'s terms beside ours, one layer, t = {t} (from `compare_with_korthikanti`). The paper's items add up to its closed form; ours add up to the measurement.": "Korthikanti 等人的各项与我们的对照，一层，t = {t}（来自 `compare_with_korthikanti`）。论文的各项加起来等于其闭式公式；我们的各项加起来等于实测值。",
}
