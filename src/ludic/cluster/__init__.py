"""Multi-host runs (docs/cluster.md): the roles' commands and the launch recipes. An apps-layer package:
it may import any layer below; none of them imports it."""
