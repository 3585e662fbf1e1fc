"""Hosts read over ssh: the host list, one stream per host, rows per GPU."""
