"""Student pages and the attempt's actions, and the console recordings' replay for course staff."""
