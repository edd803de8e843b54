"""What the workers say about an attempt (why it failed, what the cluster waits for), written in every language when
decided and shown in the reader's; the attempt's text fields keep its student's language (what the admin
searches). Words from the cluster stay the cluster's."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from django.conf import settings
from django.utils import translation
from django.utils.translation import gettext as _

from labs.health import check_cluster
from labs.sync_health import check_sync


def in_every_language(build: Callable[[], str]) -> dict[str, str]:
    """``{code: build()}`` for every language; ``build`` only translates and formats, reading nothing."""
    texts = {}
    for code, _name in settings.LANGUAGES:
        with translation.override(code):
            texts[code] = str(build())
    return texts


def in_language(texts: Mapping[str, str] | None, fallback: str, language: str | None = None) -> str:
    """The text for ``language`` (the active language by default), else ``fallback``."""
    if not texts:
        return fallback
    language = language or translation.get_language() or settings.LANGUAGE_CODE
    return texts.get(language) or texts.get(language.split("-")[0]) or fallback


def with_cluster_words(words: str, said: str) -> str:
    """``words``, then what the cluster said about it (left in the cluster's words), when it said anything."""
    return f"{words} " + _("The cluster says: %(detail)s") % {"detail": said} if said else words


def cluster_trouble(*, failing: bool = False) -> str:
    """The trouble a student's page tells of: "cluster" while its API does not answer or ``failing`` (the last
    request in the attempt's namespace failed), else "sync" while the sync loop is behind, else ""."""
    if failing or not check_cluster().ok:
        return "cluster"
    return "" if check_sync().ok else "sync"


def cluster_notice(*, state: str | None, namespace: str = "", trouble: str | None = None) -> str | None:
    """What a student's page says for the attempt's ``state`` during ``trouble`` (unless given, the trouble of its
    ``namespace``); None if all is well. Cheap enough for every page render (a remembered probe and one query)."""
    from labs.models import AttemptState  # labs.models reads its texts through this module
    from labs.selectors import namespace_failing

    if trouble is None:
        trouble = cluster_trouble(failing=namespace_failing(namespace=namespace, refusals=state is not None))
    if not trouble:
        return None
    if trouble == "sync":
        return _("Lab status updates are delayed; what you see here may be out of date for a while.")
    if state == AttemptState.RUNNING:
        return _(
            "The cluster is not answering. Your VM may still be running; Check and Stop will work when it is back."
        )
    if state == AttemptState.STOPPING:
        return _("The cluster is not answering; your lab will finish stopping when it is back.")
    return _("The cluster is not answering; your lab may be slow to start.")


def pod_refused(said: str) -> str:
    """The cluster refused the VM's pod for good (labs.kubevirt.status)."""
    if "PodSecurity" in said:
        words = _(
            "The cluster refused to start this VM: the course's namespace enforces a Pod Security level that "
            "does not allow KubeVirt's VM pods. Tell your instructor; an operator can fix it (run `python "
            "manage.py cluster_check`)."
        )
    else:
        words = _("The cluster refused to start this VM. Tell your instructor.")
    return with_cluster_words(words, said)


def pod_waiting(said: str) -> str:
    return with_cluster_words(
        _("The course's cluster quota is full for now; the VM starts as soon as another VM of the course has stopped."),
        said,
    )


def node_drained(said: str) -> str:
    return with_cluster_words(
        _(
            "The node your lab ran on was drained for maintenance, so its VM was shut down and the work in it is "
            "lost. You can start the lab again; a failed attempt does not count against your attempt limit."
        ),
        said,
    )


def course_not_ready(said: str) -> str:
    return with_cluster_words(
        _(
            "This course is not ready yet: the cluster has not been set up for it. Tell your instructor (an operator "
            "runs `python manage.py cluster_check` to see what to apply)."
        ),
        said,
    )
