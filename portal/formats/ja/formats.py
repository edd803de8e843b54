"""Japanese: "2026年12月1日21:24 JST": Django's format, with the zone's abbreviation, since each tenant has its own
clock."""

DATETIME_FORMAT = "Y年n月j日G:i T"
SHORT_DATETIME_FORMAT = "Y/m/d G:i T"
