"""labs.wording: a worker's message in every language, and the one a reader gets."""

from __future__ import annotations

from django.utils import translation
from django.utils.translation import gettext

from labs.wording import in_every_language, in_language, with_cluster_words

DELETED = "The VM was deleted outside the portal."


def test_a_message_is_worded_in_each_of_the_portals_languages(settings):
    with translation.override("ja"):  # whatever language the worker happens to be in
        texts = in_every_language(lambda: gettext(DELETED) + " (kubevirt: gone)")
    assert set(texts) == {code for code, _name in settings.LANGUAGES}
    assert texts["en"] == DELETED + " (kubevirt: gone)"
    assert texts["ja"] == "仮想マシンがポータルの外で削除されました。 (kubevirt: gone)"
    assert translation.get_language() == settings.LANGUAGE_CODE  # every override undone


def test_the_reader_gets_their_language_else_the_stored_text():
    texts = {"en": "gone", "ja": "消えました"}
    assert in_language(texts, "stored", "ja") == "消えました"
    assert in_language(texts, "stored", "en-gb") == "gone"  # a regional variant falls back to its language
    assert in_language(texts, "stored", "fr") == "stored"
    assert in_language({}, "stored", "ja") == "stored"  # written before messages had translations
    with translation.override("ja"):
        assert in_language(texts, "stored") == "消えました"


def test_what_the_cluster_said_follows_the_words_in_their_language_and_stays_its_own():
    said = 'pod "virt-launcher-x" is unschedulable'
    texts = in_every_language(lambda: with_cluster_words(gettext(DELETED), said))
    assert texts["en"] == f"{DELETED} The cluster says: {said}"
    assert texts["ja"] == f"仮想マシンがポータルの外で削除されました。 クラスターからのメッセージ: {said}"
    assert with_cluster_words(DELETED, "") == DELETED  # nothing said, nothing added
