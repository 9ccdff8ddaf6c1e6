"""Chinese for the lab harness's messages: check results, exercise notices, the summary (see pylib.i18n)."""

MESSAGES: dict[str, str] = {}
