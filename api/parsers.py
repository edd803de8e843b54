"""The API's JSON parser: DRF's, with a document nested deeper than Python's parser follows refused as a parse
error (400) instead of raising ``RecursionError`` (500)."""

from __future__ import annotations

from django.utils.translation import gettext as _
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser


class JSONParserBoundedDepth(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError(_("JSON parse error - the document is nested too deeply.")) from None
