"""Chinese for the chapters' output: table captions and headers, figure text, verdicts (see pylib.i18n)."""

MESSAGES: dict[str, str] = {}
