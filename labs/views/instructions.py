"""Lab instructions: Markdown written by instructors, rendered to HTML and sanitised before it reaches a page."""

from __future__ import annotations

from functools import lru_cache

import markdown
import nh3
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

ALLOWED_TAGS = {
    *("h1", "h2", "h3", "h4", "h5", "h6", "p", "br", "hr", "blockquote", "details", "summary"),  # blocks
    *("a", "abbr", "b", "i", "em", "strong", "s", "del", "sub", "sup", "img"),  # inline
    *("code", "kbd", "pre", "samp"),  # code
    *("ul", "ol", "li", "dl", "dt", "dd"),  # lists
    *("table", "thead", "tbody", "tr", "th", "td"),  # tables
}
ALLOWED_ATTRIBUTES = {
    "a": {"href", "title"},
    "img": {"src", "alt", "title", "width", "height"},
    "abbr": {"title"},
    "th": {"align"},
    "td": {"align"},
}
# No ``id`` or ``name`` anywhere: instructions must not clobber the page's own elements (DOM clobbering).


def render_instructions(text: str, *, title: str = "") -> SafeString:
    """Markdown → only harmless HTML (links open no window handle), without a first heading repeating ``title``."""
    html = _render(text or "")
    repeated_title = f"<h1>{escape(title)}</h1>"
    if title and html.lstrip().startswith(repeated_title):
        return mark_safe(html.lstrip()[len(repeated_title) :].lstrip())  # noqa: S308  (already sanitised)
    return html


@lru_cache(maxsize=256)
def _render(text: str) -> SafeString:
    html = markdown.markdown(text, extensions=["fenced_code", "tables", "sane_lists", "def_list"], output_format="html")
    cleaned = nh3.clean(
        html,
        tags=ALLOWED_TAGS,
        attributes=ALLOWED_ATTRIBUTES,
        url_schemes={"http", "https", "mailto"},
        link_rel="noopener noreferrer nofollow",
    )
    return mark_safe(cleaned)  # noqa: S308  (sanitised by nh3 just above)
