"""runtime/checkpointless"""
