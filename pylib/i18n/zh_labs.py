"""Chinese for the lab harness's messages: check results, exercise notices, the summary (see pylib.i18n)."""

MESSAGES: dict[str, str] = {
    # pylib.labs.checks: the lines a learner reads under each cell
    "Exercise {number} not done yet: {what}": "练习 {number} 尚未完成：{what}",
    "needs step {step!r}, which failed: {reason}": "依赖的步骤 {step!r} 失败了：{reason}",
    "needs step {step!r}, which is blocked: {reason}": "依赖的步骤 {step!r} 被阻塞：{reason}",
    "needs {want} CUDA GPUs, {have} visible on this machine": "需要 {want} 块 CUDA GPU，本机可见 {have} 块",
    "needs {want} CUDA GPU, {have} visible on this machine": "需要 {want} 块 CUDA GPU，本机可见 {have} 块",
    "assertion failed": "断言失败",
    "the condition is False": "条件为 False",
    "the condition is falsy": "条件为假",
    "cannot tell whether {kind} is true: {exc}": "无法判断 {kind} 的真假：{exc}",
    "  ({seconds:.2f} s)": "  （{seconds:.2f} 秒）",
    "  [blocked: {message}]": "  [已阻塞：{message}]",
    "{total} checks: {passed} passed, {failed} failed, {blocked} blocked": (
        "共 {total} 项检查：{passed} 项通过，{failed} 项失败，{blocked} 项阻塞"
    ),
    "no check ran: a lab must record at least one check": "没有任何检查运行：一个实验至少要记录一项检查",
    "{failed} of {total} checks failed:": "{total} 项检查中有 {failed} 项失败：",
}

MESSAGES.update(
    {
        # pylib.labs.report: the terminal table and the failures under it
        "{mark} {lab}: blocked, {why}": "{mark} {lab}：已阻塞，{why}",
        ", {n} not run": "，{n} 项未运行",
        "{mark} {lab}: {status} in {seconds:.1f} s ({passed} passed, {failed} failed, {blocked} blocked{not_run})": (
            "{mark} {lab}：{status}，用时 {seconds:.1f} 秒（{passed} 项通过，{failed} 项失败，{blocked} 项阻塞{not_run}）"  # noqa: E501
        ),
        "⊘ lab {lab} blocked, {why}": "⊘ 实验 {lab} 已阻塞，{why}",
        "✗ lab {lab} {status} (executed notebook: {path})": "✗ 实验 {lab} {status}（执行后的 notebook：{path}）",
        " ({count} checks wait on it)": "（{count} 项检查依赖它）",
        "  ✗ exercise {n} not done yet: {what}{also}": "  ✗ 练习 {n} 尚未完成：{what}{also}",
        "  … {n} check(s) never ran (the lab stopped before them)": "  … {n} 项检查没有运行（实验在它们之前停止了）",
        "  ✗ check {name!r} failed in {where}:": "  ✗ 检查 {name!r} 失败，位于 {where}：",
        "    rank {rank}'s traceback:": "    进程号 {rank} 的 traceback：",
        "  ⊘ {lab}: check {name!r} blocked: {why}": "  ⊘ {lab}：检查 {name!r} 已阻塞：{why}",
        "passed": "通过",
        "failed": "失败",
        "blocked": "阻塞",
        "interrupted": "中断",
        "timeout": "超时",
        "lab": "实验",
        "status": "状态",
        "not run": "未运行",
        "seconds": "秒",
        "{passed}/{labs} labs passed": "{passed}/{labs} 个实验通过",
        # pylib.labs.cli
        "solution": "解答",
        "learner": "学习者",
        "running {n} lab(s) in {mode} mode with {overrides}; executed notebooks and report in {out}": (
            "以{mode}模式运行 {n} 个实验，参数覆盖 {overrides}；执行后的 notebook 和报告在 {out}"
        ),
        "running {n} lab(s) in {mode} mode; executed notebooks and report in {out}": (
            "以{mode}模式运行 {n} 个实验；执行后的 notebook 和报告在 {out}"
        ),
        "report: {json} and {html}": "报告：{json} 和 {html}",
        "INTERRUPTED ({why}): the report marks the running lab 'interrupted'": "已中断（{why}）：报告把正在运行的实验标为 'interrupted'",  # noqa: E501
        "FAILED: {bad} of {n} lab(s) did not pass ({mode} mode): {names}": (
            "失败：{n} 个实验中有 {bad} 个未通过（{mode}模式）：{names}"
        ),
    }
)

MESSAGES.update(
    {
        # pylib.labs.report: the HTML page (report.html)
        "<b>Interrupted ({why})</b>; not started: {labs}. ": "<b>已中断（{why}）</b>；未开始：{labs}。",
        "Labs report ({mode})": "实验报告（{mode}）",
        "Labs report: {passed}/{labs} labs passed ({mode} mode)": "实验报告：{passed}/{labs} 个实验通过（{mode}模式）",
        "{started}, {seconds:.1f} s. Checks: {passed} passed, {failed} failed, {blocked} blocked (need hardware this machine lacks), {not_run} never ran. ": (  # noqa: E501
            "{started}，{seconds:.1f} 秒。检查：{passed} 项通过，{failed} 项失败，{blocked} 项阻塞（需要本机没有的硬件），{not_run} 项未运行。"  # noqa: E501
        ),
        "Machine: Python {python}, torch {torch}, {cpus} CPUs, {gpus} CUDA GPUs. ": (
            "机器：Python {python}，torch {torch}，{cpus} 个 CPU，{gpus} 块 CUDA GPU。"
        ),
        "Overrides: {overrides}.": "覆盖参数：{overrides}。",
        "Executed notebook: {link}. Parameters: {params}": "执行后的 notebook：{link}。参数：{params}",
        " on rank {rank}": "（进程号 {rank}）",
        "{error}{who} in {where}": "{error}{who}，位于 {where}",
        "traceback": "traceback",
        "check": "检查",
        "cell": "单元格",
        "details": "详情",
        "(step)": "（步骤）",
        "cell ?": "单元格 ?",
        "cell {n}": "单元格 {n}",
    }
)
