"""Japanese: "2026年12月1日 21:24 JST", as the browser's Intl writes it (the live page draws some), with the zone's
abbreviation, since each tenant has its own clock."""

DATETIME_FORMAT = "Y年n月j日 G:i T"
SHORT_DATETIME_FORMAT = "Y/m/d G:i T"
