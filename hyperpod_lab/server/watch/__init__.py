"""server/watch"""
