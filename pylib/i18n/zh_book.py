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
}
