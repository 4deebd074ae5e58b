// IgiImageCapture.cpp - IgiRuntime: render target / texture reads and PNG/JPEG encoding through IImageWrapper.
#include "IgiImageCapture.h"

#include "Engine/Texture2D.h"
#include "Engine/TextureRenderTarget2D.h"
#include "IImageWrapper.h"
#include "IImageWrapperModule.h"
#include "Modules/ModuleManager.h"
#include "TextureResource.h"

bool UIgiImageCapture::FromPixels(const TArray<FColor>& Pixels, int32 Width, int32 Height,
                                  EIgiImageEncoding Encoding, int32 JpegQuality, igi::Image& Out, FString& Error)
{
	if (Width < 1 || Height < 1 || Pixels.Num() != Width * Height)
	{
		Error = FString::Printf(TEXT("%d pixels are not %dx%d"), Pixels.Num(), Width, Height);
		return false;
	}
	if (Width > igi::kMaxImageSidePx || Height > igi::kMaxImageSidePx)
	{
		Error = FString::Printf(TEXT("%dx%d exceeds %lld px per side"), Width, Height, igi::kMaxImageSidePx);
		return false;
	}
	const uint8* Bgra = reinterpret_cast<const uint8*>(Pixels.GetData());
	if (Encoding == EIgiImageEncoding::Rgb8)
	{
		Out = igi::Image::Raw(igi::BgraToRgb(Bgra, Width, Height), Width, Height, false);
		return true;
	}
	IImageWrapperModule& Module = FModuleManager::LoadModuleChecked<IImageWrapperModule>(FName("ImageWrapper"));
	TSharedPtr<IImageWrapper> Wrapper =
	    Module.CreateImageWrapper(Encoding == EIgiImageEncoding::Png ? EImageFormat::PNG : EImageFormat::JPEG);
	if (!Wrapper.IsValid() || !Wrapper->SetRaw(Bgra, Pixels.Num() * sizeof(FColor), Width, Height, ERGBFormat::BGRA, 8))
	{
		Error = TEXT("the image encoder refused the pixels");
		return false;
	}
	const TArray64<uint8> Compressed = Wrapper->GetCompressed(Encoding == EIgiImageEncoding::Png ? 0 : JpegQuality);
	igi::Bytes Data(Compressed.GetData(), Compressed.GetData() + Compressed.Num());
	Out = Encoding == EIgiImageEncoding::Png ? igi::Image::Png(std::move(Data)) : igi::Image::Jpeg(std::move(Data));
	return true;
}

bool UIgiImageCapture::FromRenderTarget(UTextureRenderTarget2D* Target, EIgiImageEncoding Encoding, int32 JpegQuality,
                                        igi::Image& Out, FString& Error)
{
	FTextureRenderTargetResource* Resource = Target ? Target->GameThread_GetRenderTargetResource() : nullptr;
	if (Resource == nullptr)
	{
		Error = TEXT("no render target resource");
		return false;
	}
	TArray<FColor> Pixels;
	if (!Resource->ReadPixels(Pixels))  // flushes rendering commands; top row first, BGRA
	{
		Error = TEXT("ReadPixels failed");
		return false;
	}
	return FromPixels(Pixels, Target->SizeX, Target->SizeY, Encoding, JpegQuality, Out, Error);
}

bool UIgiImageCapture::FromTexture2D(UTexture2D* Texture, EIgiImageEncoding Encoding, int32 JpegQuality,
                                     igi::Image& Out, FString& Error)
{
	FTexturePlatformData* Platform = Texture ? Texture->GetPlatformData() : nullptr;
	if (Platform == nullptr || Platform->Mips.Num() == 0 || Platform->PixelFormat != PF_B8G8R8A8)
	{
		Error = TEXT("the texture's top mip is not uncompressed BGRA8 (see the header)");
		return false;
	}
	FTexture2DMipMap& Mip = Platform->Mips[0];
	const void* Data = Mip.BulkData.LockReadOnly();
	if (Data == nullptr)
	{
		Error = TEXT("the texture's pixels are not in CPU memory");
		return false;
	}
	TArray<FColor> Pixels;
	Pixels.SetNumUninitialized(Mip.SizeX * Mip.SizeY);
	FMemory::Memcpy(Pixels.GetData(), Data, Pixels.Num() * sizeof(FColor));
	Mip.BulkData.Unlock();
	return FromPixels(Pixels, Mip.SizeX, Mip.SizeY, Encoding, JpegQuality, Out, Error);
}
