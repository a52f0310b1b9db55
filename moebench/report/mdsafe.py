"""Text read from a run folder, made inert before it reaches Markdown (or the HTML a viewer
renders from it). Everything a run folder holds is untrusted: env.json, the rows (labels,
reasons, identity values), sweep-*.json (cli_overrides), trace names; the repository's own
text (caveats.md, about.md, our captions) is written as it is.

    md_text(value)            one line of plain text: no heading, list, quote, table cell break,
                              HTML, link, image, code span or emphasis can come out of it
    md_code(value)            an inline code span no content can close
    code_block(text, info)    a fenced block no content can close
    one_line(value)           newlines and control characters made visible (code contexts,
                              where backslash escapes would show)
    shell_join(words)         a command line for a code block, one line whatever the words hold

A field is one line: a newline in it shows as ``⏎`` (never a line break that would start a
block of its own). The escapes are CommonMark's backslash escapes, and HTML's entities for
``<``, ``>`` and ``&`` (which every Markdown renderer leaves as text, inside HTML too).
"""

from __future__ import annotations

import functools
import re
import shlex

NEWLINE = "⏎"
_LINE_BREAKS = re.compile(r"\r\n|[\r\n\v\f\x1c-\x1e\x85\u2028\u2029]")
# C0 / C1 controls and DEL (terminal escapes on stdout) shown as U+FFFD; tab as a space
_CONTROLS = re.compile(r"[\x00-\x08\x0e-\x1b\x1f\x7f-\x84\x86-\x9f]")
# always escaped: code spans, emphasis, strikethrough, link and image brackets, table cells, math
_ALWAYS = re.compile(r"([\\`*\[\]|~$])")
# at the start of a line: a heading, a bullet (`- x`, `+ x`) or thematic break / setext underline
# (`---`, `===`); an ordered item (`1. x`, `1)`) gets its `.` / `)` escaped; `>` is an entity by then, and
# leading blanks (an indented code block) are dropped. `-0.5` and `+x` start no block and stay as they are.
_LEADING = re.compile(r"^(?:#|=|[-+](?![0-9A-Za-z]))")
_ORDERED = re.compile(r"^(\d{1,9})(?=[.)](?:\s|$))")
_HTML = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}


def one_line(value) -> str:
    """`value` as one line: newlines (any line break) as ⏎, other control characters as U+FFFD."""
    text = _LINE_BREAKS.sub(f" {NEWLINE} ", str(value)).replace("\t", " ")
    return _CONTROLS.sub("\ufffd", text)


def md_text(value) -> str:
    """Untrusted text as inert one-line Markdown that reads as the text itself (units: none).

    Neutralized: line breaks (shown as ⏎), leading `#` `>` `-` `+` `=` and `1.` / `1)` (headings,
    quotes, lists, setext underlines), `|` (table cells), `<` `>` `&` (HTML, autolinks, entities),
    `[` `]` (links and images: no `](` can form, so `(` `)` and `!` stay as they are), backticks
    (code spans), `*` `~` and `_` at a word's edge (emphasis; `tokens_per_rank` stays readable),
    `$` (math), and backslashes themselves. Leading and trailing blanks are dropped.
    """
    return _md_text(str(value))  # str(): what one_line reads of a str subclass (an enum member) too


@functools.lru_cache(maxsize=1 << 16)  # a report escapes the same labels and statuses thousands of times
def _md_text(value: str) -> str:
    text = one_line(value).strip()
    text = _ALWAYS.sub(r"\\\1", text)
    # `_` opens or closes emphasis only at a word's edge: `a_b` is left alone
    text = re.sub(r"(?<![0-9A-Za-z])_|_(?![0-9A-Za-z])", r"\\_", text)
    text = "".join(_HTML.get(ch, ch) for ch in text)
    if _LEADING.match(text):
        return "\\" + text
    return _ORDERED.sub(r"\1\\", text)


def md_code(value) -> str:
    """`value` as an inline code span (one line) that no backtick inside can close."""
    text = one_line(value)
    run = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * (run + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def code_block(text: str, info: str = "") -> str:
    """A fenced code block of `text` (its lines as they are) whose fence is longer than any
    backtick run inside, so that no line of it can close the block; `info` is the language."""
    run = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, run + 1)
    return f"{fence}{one_line(info)}\n{text}\n{fence}"


def shell_word(word) -> str:
    """One shell word on one line: shlex.quote, or for a word holding a line break or another
    control character (text of a sweep-*.json), bash's $'...' quoting with the character escaped."""
    word = str(word)
    if word.isprintable():
        return shlex.quote(word)
    out = []
    for ch in word:
        if ch in "\\'":
            out.append("\\" + ch)
        elif ch.isprintable():
            out.append(ch)
        else:
            out.append({"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(ch, f"\\U{ord(ch):08x}"))
    return "$'" + "".join(out) + "'"


def shell_join(words) -> str:
    """A command line of `words` (shell_word each): one line whatever they hold."""
    return " ".join(shell_word(w) for w in words)
