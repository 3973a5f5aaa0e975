
héllo <|im_start|>