"""The scripted expert of `miniwob` (`MiniWoBEnv.expert_action`): one DOM-reading plan per task in `EXPERT_TASKS`.

Each plan reads the page MiniWoB observes (its `DOMElement` tree and the utterance's fields) and returns the next
step: an element to click, which the env turns into `click(x, y)` at the element's centre in image pixels (with
noise where asked), or an action string (`type(...)`, `press(...)`, `finish()`). It never reads the reward.
"""

from __future__ import annotations

import json
from typing import Any

# The tasks the expert solves (a DOM-reading plan each), which are also the default task set.
EXPERT_TASKS = (
    "click-button",
    "click-link",
    "click-dialog",
    "click-checkboxes",
    "enter-text",
    "focus-text",
    "click-tab",
    "login-user",
    "choose-list",
    "use-autocomplete",
)


def _elements(dom: Any) -> list[Any]:
    return list(dom.subtree_elements)


def _text(element: Any) -> str:
    """An element's visible text: its own, or its text children's."""
    if element.text:
        return element.text.strip()
    return " ".join(c.text.strip() for c in element.children if c.tag == "t" and c.text).strip()


def _find(dom: Any, tag: str | tuple[str, ...], text: str | None = None, element_id: str | None = None) -> Any:
    tags = (tag,) if isinstance(tag, str) else tag
    for element in _elements(dom):
        if element.tag not in tags:
            continue
        if text is not None and _text(element) != text:
            continue
        if element_id is not None and element.id != element_id:
            continue
        return element
    return None


def _fill(field: Any, wanted: str) -> Any:
    """The next step to make a text field hold `wanted`, None when it does: click it unless it has focus, then type
    what is missing (a field holding something else loses one character per step to backspace)."""
    value = field.value or ""
    if value == wanted:
        return None
    if not field.focused:
        return field
    if not wanted.startswith(value):
        return "press(backspace)"
    return f"type({json.dumps(wanted[len(value) :], ensure_ascii=False)})"


def expert_step(task: str, dom: Any, fields: dict[str, str], env: Any, last: str = "") -> Any:
    """The expert's next step on a page: an element to click (a `DOMElement`) or an action string.

    Args:
        task: The MiniWoB++ task name.
        dom: The page's root `DOMElement` (MiniWoB's observation).
        fields: The utterance's fields (MiniWoB's field extractor), e.g. `{"target": "Ok"}`.
        env: The world's `miniwob` env (its page is read for choose-list's options and use-autocomplete's items).
        last: The expert's previous answer in this episode ("" at its start).

    Raises:
        ValueError: `task` has no expert.
    """
    if task == "click-button":
        return _find(dom, "button", fields["target"]) or "finish()"
    if task == "click-link":
        links = [e for e in _elements(dom) if "alink" in (e.classes or "").split() and _text(e) == fields["target"]]
        return links[0] if links else "finish()"
    if task == "click-dialog":
        close = [e for e in _elements(dom) if "ui-dialog-titlebar-close" in (e.classes or "")]
        return close[0] if close else "finish()"
    if task == "focus-text":
        return _find(dom, "input_text") or "finish()"
    if task == "click-tab":
        return _find(dom, "a", f"Tab #{fields['target']}") or "finish()"
    if task == "click-checkboxes":
        wanted = {v for k, v in fields.items() if k.startswith("target")}
        for box in (e for e in _elements(dom) if e.tag == "input_checkbox"):
            if bool(box.value) != (_text(box.parent) in wanted):
                return box
        return _find(dom, "button", "Submit") or "finish()"
    if task == "enter-text":
        step = _fill(_find(dom, "input_text"), fields["target"])
        return step if step is not None else _find(dom, "button", "Submit")
    if task == "login-user":
        for name in ("username", "password"):
            step = _fill(_find(dom, ("input_text", "input_password"), element_id=name), fields[name])
            if step is not None:
                return step
        return _find(dom, "button", "Login")
    if task == "choose-list":
        select = _find(dom, "select")
        chosen = env.instance.driver.execute_script("var s = document.querySelector('select'); return s.value;")
        if chosen == fields["target"]:
            return _find(dom, "button", "Submit")
        if not select.focused:
            return select
        # Clicking the list opens its popup, where typing moves the highlight and enter picks it; once the popup
        # is closed, typing picks the option at once.
        return (
            "press(enter)" if last.startswith("type(") else f"type({json.dumps(fields['target'], ensure_ascii=False)})"
        )
    if task == "use-autocomplete":
        item = env.instance.driver.execute_script(
            "var s = arguments[0], e = arguments[1] || '';"
            "return ui_utils.COUNTRIES.find(c => c.startsWith(s) && c.endsWith(e)) || null;",
            fields["start"],
            fields.get("end", ""),
        )
        step = _fill(_find(dom, "input_text"), item or fields["start"])
        return step if step is not None else _find(dom, "button", "Submit")
    raise ValueError(f"no expert for MiniWoB++ task {task!r}; experts exist for {', '.join(EXPERT_TASKS)}")
