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
