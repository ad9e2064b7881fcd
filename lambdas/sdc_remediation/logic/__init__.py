"""The domain logic: one module per step or concern, called by ``steps`` (what the handlers
call), free of boto3 and HTTP (``clients``) and of table layouts (``dal``). Pure policies
(``admission``, ``autoapprove``, ``outcomes``, ``stats``, ``notify``'s texts) read no table
and no clock of their own."""
