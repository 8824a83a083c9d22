"""NexusFlow's MariaDB/MySQL database backend (Django's, with one statement fewer per transaction); see
:mod:`nexusflow.kernel.mysql.base`."""
