"""English: "Dec 1, 2026, 9:24 PM JST". Dates and times as the browser's Intl writes them (the live page draws some),
not Django's "9:24 p.m."; the zone's abbreviation ends every date and time, since each tenant has its own clock."""

DATETIME_FORMAT = "M j, Y, g:i A T"
SHORT_DATETIME_FORMAT = "m/d/Y g:i A T"
TIME_FORMAT = "g:i A"
