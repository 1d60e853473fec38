"""runtime/checkpoint"""
