r"""MkDocs hook: table cells written for GitHub escape a pipe inside code (`a\|b`); Python-Markdown
keeps the backslash there, so drop it from rendered code spans."""

import re

_CODE = re.compile(r"<code>(.*?)</code>", re.S)


def on_page_content(html, **kwargs):
    return _CODE.sub(lambda m: "<code>" + m.group(1).replace("\\|", "|") + "</code>", html)
