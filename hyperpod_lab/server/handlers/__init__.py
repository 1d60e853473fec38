"""server/handlers"""
