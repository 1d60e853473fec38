"""notebook"""
