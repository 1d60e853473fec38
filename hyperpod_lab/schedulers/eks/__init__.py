"""schedulers/eks"""
