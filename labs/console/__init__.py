"""The console bridge: one upstream VMI console connection per attempt, shared by every viewer.

``lease`` elects the viewer that holds the upstream, ``upstream`` speaks KubeVirt's ``plain.kubevirt.io``
console protocol, ``scrollback`` keeps the recent output a (re)connecting tab replays, ``recording`` writes the
output as asciicast v2, and ``flow`` holds the per-viewer limits (output window, input rate).
"""
