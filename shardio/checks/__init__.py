"""Checks of the values users hand shardio, where they enter: option values, a saved state's fields, and a
dataset's source and filters against its index; each raises the typed error of its kind."""
