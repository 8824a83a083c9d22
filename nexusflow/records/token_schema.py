"""The OpenAPI security scheme of operator API tokens (drf-spectacular extension; imported at app start)."""
from drf_spectacular.extensions import OpenApiAuthenticationExtension


class OperatorTokenScheme(OpenApiAuthenticationExtension):
    target_class = "nexusflow.records.tokens.OperatorTokenAuthentication"
    name = "operatorToken"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "bearerFormat": "nft_ operator token (manage.py operator_tokens)"}
